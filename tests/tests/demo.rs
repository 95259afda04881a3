//! The README's first command, end to end: `fleetmend-demo` (what `scripts/demo.sh` runs
//! after building) must end every injected failure as described, the dead machine's power
//! going through its bmc-gateway to OpenIPMI `ipmi_sim` BMCs, say so in its summary, exit 0,
//! and leave no process behind; interrupted midway (Ctrl-C, SIGTERM, its output closed as by
//! `| head`), it must stop everything it started (the gateway and the simulators included).
//! With `--stand-in` (what it falls back to without `ipmi_sim`) it says plainly that there is
//! no BMC.
//!
//! Needs `ipmi_sim` (scripts/setup-test-deps.sh installs it): without it the demo would fall
//! back to its stand-in and the first test fails, as it should in CI.
//!
//! Leftovers are found by an environment variable set only for the demo (not `FLEETMEND_*`,
//! which the test kit keeps from children): every process it starts (coordinator, agents,
//! their commands) inherits it, so a process still carrying it after the demo exited is one
//! it left behind.

mod demo_run;

use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use demo_run::{DEMO_TIMEOUT, Run, assert_the_stories_ended_as_described, work_dir};

#[test]
fn the_demo_ends_every_injected_failure_as_described_and_leaves_nothing_running()
-> anyhow::Result<()> {
    let mut run = Run::start(&[])?;
    let (code, out) = run.finish(DEMO_TIMEOUT)?;
    assert_eq!(code, Some(0), "{out}");
    assert_the_stories_ended_as_described(&out)?;
    run.assert_nothing_left()?;
    let dir = work_dir(&out).context("no working directory line")?;
    assert!(!std::path::Path::new(dir).exists(), "{dir} is left behind");
    Ok(())
}

#[test]
fn an_interrupted_demo_stops_everything_it_started() -> anyhow::Result<()> {
    let mut run = Run::start(&[])?;
    // Midway: the gateway and the BMCs run, the first failure is injected.
    run.until("power control: a bmc-gateway on", DEMO_TIMEOUT)?;
    run.until("inject", DEMO_TIMEOUT)?;
    let pid = run.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()?;
    assert!(status.success());
    let (code, out) = run.finish(Duration::from_secs(30))?;
    assert_eq!(code, Some(130), "{out}");
    assert!(!out.contains("\nSummary\n"), "{out}");
    run.assert_nothing_left()?;
    let dir = work_dir(&out).context("no working directory line")?;
    assert!(!std::path::Path::new(dir).exists(), "{dir} is left behind");
    Ok(())
}

#[test]
fn a_demo_whose_output_is_closed_stops_quietly_and_leaves_nothing_running() -> anyhow::Result<()> {
    let mut run = Run::start(&[])?;
    run.until("power control: a bmc-gateway on", DEMO_TIMEOUT)?;
    // As `| head` does: the reader goes away; the reading thread drops the pipe at the next
    // line, and the demo's next write fails.
    run.lines = mpsc::channel().1;
    let (code, _) = run.finish(Duration::from_secs(60))?;
    // 141, as for a program SIGPIPE killed: it stopped before the end.
    assert_eq!(code, Some(141), "{}", run.seen.join("\n"));
    run.assert_nothing_left()?;
    Ok(())
}

#[test]
fn with_the_stand_in_it_says_plainly_there_is_no_bmc_and_sigterm_stops_it() -> anyhow::Result<()> {
    let mut run = Run::start(&["--stand-in"])?;
    let line = run.until("power control:", DEMO_TIMEOUT)?;
    assert!(
        line.contains("--stand-in, so no BMC and no bmc-gateway: a stand-in script"),
        "{line}"
    );
    run.until("inject", DEMO_TIMEOUT)?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &run.child.id().to_string()])
        .status()?;
    assert!(status.success());
    let (code, out) = run.finish(Duration::from_secs(30))?;
    assert_eq!(code, Some(143), "{out}");
    assert!(!out.contains("bmc-gateway on"), "{out}");
    run.assert_nothing_left()?;
    Ok(())
}
