//! `scripts/demo.sh --etcd`: the README's demo with the coordinator's state in a real etcd
//! (the one `scripts/setup-test-deps.sh` builds from its Go module). Its own file so the
//! suite's runner starts it with the other etcd tests, after the Go build.

mod demo_run;

use demo_run::{DEMO_TIMEOUT, Run, assert_the_stories_ended_as_described};
use testkit::procs::command;

/// `scripts/demo.sh --etcd`: the same three stories with the coordinator's state in an etcd
/// (`backend = "etcd"`, one coordinator): the kubelet restarted, the dead machine fenced with
/// one off and one on at its BMC and its workload released, the rack outage held. Needs the
/// etcd that `scripts/setup-test-deps.sh` builds.
#[test]
fn with_etcd_the_three_stories_end_as_described() -> anyhow::Result<()> {
    let mut run = Run::start(&["--etcd"])?;
    let (code, out) = run.finish(DEMO_TIMEOUT)?;
    assert_eq!(code, Some(0), "{out}");
    for needle in [
        "--etcd: an etcd at http://127.0.0.1:",
        "backend = \"etcd\"), one coordinator",
        "ok: leader",
    ] {
        assert!(out.contains(needle), "no {needle:?} in:\n{out}");
    }
    assert!(!out.contains("coord-b"), "{out}");
    assert_the_stories_ended_as_described(&out)?;
    run.assert_nothing_left()?;
    Ok(())
}

#[test]
fn etcd_and_ha_are_one_choice() -> anyhow::Result<()> {
    let out = command("fleetmend-demo")
        .args(["--etcd", "--ha"])
        .output()?;
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--etcd and --ha are one choice"), "{err}");
    Ok(())
}

/// `scripts/demo.sh --ha`: two coordinators on an etcd; the leader is killed in the middle of
/// the dead-machine story, the standby takes the lead and finishes it, every agent comes back
/// to it, and the rack story still ends as described. Needs the etcd that
/// `scripts/setup-test-deps.sh` builds.
/// `cargo test -p fleetmend-tests --test demo -- --ignored --nocapture ha`
#[test]
#[ignore = "slow (about 40 s more than the default demo); run by name"]
fn with_ha_the_standby_takes_over_in_the_middle_of_the_dead_machine_story() -> anyhow::Result<()> {
    let mut run = Run::start(&["--ha"])?;
    let (code, out) = run.finish(DEMO_TIMEOUT)?;
    assert_eq!(code, Some(0), "{out}");
    for needle in [
        "coord-b (127.0.0.1:",
        "ok: standby since ",
        "the leading coordinator (coord, 127.0.0.1:",
        "took the lead",
        "it resumes the flow from etcd",
        "agents report to coord-b",
        "All 3 injected failures ended as described.",
    ] {
        assert!(out.contains(needle), "no {needle:?} in:\n{out}");
    }
    // The takeover comes after the dead machine's power-off and before the rack story.
    let at = |needle: &str| out.find(needle).unwrap_or(usize::MAX);
    assert!(at("took the lead") < at("rack-2 loses power"), "{out}");
    run.assert_nothing_left()?;
    Ok(())
}
