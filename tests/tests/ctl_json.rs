//! Issue 9, item 7: `coordinatorctl … --json` is JSON scripts can use. A real coordinator
//! with one real agent whose NIC fails and a paused remediation; each command's `--json`
//! must parse into the test kit's script-side types ([`testkit::ctl_json`], unknown fields
//! denied, times as RFC 3339), and no output may carry a `*_unix_ms` integer or a label list.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use testkit::ctl_json::{
    Cleared, Constraints, JournalLine, MachineDetail, MachineSummary, RemediationStatus,
};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, start_agent, wait_for};

const SETTLE: Duration = Duration::from_secs(60);
const REPORT: Duration = Duration::from_millis(300);

/// Every key in `v`, recursively.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                out.push(k.clone());
                keys(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// `s` is RFC 3339 in UTC with exactly milliseconds: `2026-11-23T06:35:12.345Z`.
fn is_ms_utc(s: &str) -> bool {
    s.len() == 24
        && s.ends_with('Z')
        && s.as_bytes()[19] == b'.'
        && s.parse::<jiff::Timestamp>().is_ok()
}

#[test]
fn json_outputs_have_rfc3339_times_and_label_maps() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
    let inventory = "[[machines]]\naddress = \"10.0.3.1\"\nhostname = \"j1\"\nserial = \"SN-J1\"\n\
                     rack = \"r1\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n\
                     labels = { zone = \"a\", pool = \"gpu\" }\n";
    let mut coord = Coordinator::start(
        &dir.join("coord"),
        &pki,
        &CoordinatorOptions {
            report_interval: REPORT,
            unreachable_grace: REPORT * 3,
            inventory: Some(inventory.into()),
            extra: "[remediation]\ninterval = \"500ms\"\n[remediation.auto_repair]\nunhealthy_for = \"0s\"\n"
                .into(),
            health_extra: String::new(),
        },
    )?;
    let fixture = NodeFixture::builder("j1")
        .nic("eth0")
        .address("10.0.3.1".parse()?)
        .build()?;
    let kubelet = FakeKubelet::start()?;
    let tls = pki.issue("node", "j1", &[])?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(REPORT)
            .kubelet_url(&kubelet.url()),
    )?;
    let _agent = start_agent("j1", &cfg, &dir.join("j1.log"))?;
    coord.wait_for_state("j1", "healthy", SETTLE)?;
    fixture.set_carrier("eth0", false)?;
    coord.wait_for_state("j1", "unhealthy", SETTLE)?;
    coord.ctl(&["remediation", "pause", "--reason", "json test"])?;
    // A pass after the pause, so that status and events have something to show.
    wait_for("a decision in the journal", SETTLE, || {
        let l: Vec<JournalLine> = coord
            .ctl_json(&["events", "--json"])
            .map_err(|e| e.to_string())?;
        (!l.is_empty())
            .then_some(())
            .ok_or_else(|| "none yet".to_string())
    })?;

    let outputs: Vec<(&[&str], Value)> = [
        &["machines", "list", "--json"][..],
        &["machines", "show", "10.0.3.1", "--json"],
        &["remediation", "status", "--json"],
        &["events", "--json"],
        &["constraints", "show", "--json"],
    ]
    .into_iter()
    .map(|args| Ok((args, coord.ctl_json::<Value>(args)?)))
    .collect::<anyhow::Result<_>>()?;
    for (args, v) in &outputs {
        let mut ks = Vec::new();
        keys(v, &mut ks);
        assert!(
            ks.iter().all(|k| !k.ends_with("_unix_ms")),
            "{args:?} still prints Unix milliseconds: {v:#}"
        );
    }

    let list: Vec<MachineSummary> = serde_json::from_value(outputs[0].1.clone())?;
    assert_eq!(list[0].spec.labels["zone"], "a");
    assert_eq!(list[0].spec.labels["pool"], "gpu");
    assert!(is_ms_utc(
        outputs[0].1[0]["state_since"].as_str().unwrap_or_default()
    ));
    let show: MachineDetail = serde_json::from_value(outputs[1].1.clone())?;
    assert!(show.failing_since.contains_key("nic:eth0"), "{show:#?}");
    let report = show.last_report.as_ref().expect("a report");
    assert!(report.time <= jiff::Timestamp::now());
    assert!(show.last_report_at.is_some());
    let last = show.transitions.last().expect("a transition");
    assert_eq!(last.to, "unhealthy");
    assert!(is_ms_utc(
        outputs[1].1["last_report_at"].as_str().unwrap_or_default()
    ));
    let st: RemediationStatus = serde_json::from_value(outputs[2].1.clone())?;
    let paused = st.paused.expect("paused");
    assert_eq!(paused.reason, "json test");
    assert!(st.last_pass_at.is_some_and(|t| t >= paused.since));
    let events: Vec<JournalLine> = serde_json::from_value(outputs[3].1.clone())?;
    let held = events
        .iter()
        .find(|l| l.address == "10.0.3.1" && l.rule == "paused")
        .expect("the paused hold");
    assert!(held.first_at <= held.last_at);
    let c: Constraints = serde_json::from_value(outputs[4].1.clone())?;
    assert!(c.maximum_repair_queue_entries > 0);
    // `constraints set --json` prints the constraints in force after the change, as `show`.
    let set: Constraints = coord.ctl_json(&[
        "constraints",
        "set",
        "maximum-repair-queue-entries",
        "7",
        "--json",
    ])?;
    assert_eq!(set.maximum_repair_queue_entries, 7);
    let shown: Constraints = coord.ctl_json(&["constraints", "show", "--json"])?;
    assert_eq!(shown, set);
    let out = coord.ctl(&["constraints", "set", "maximum-repair-queue-entries", "8"])?;
    assert!(out.stdout.is_empty(), "quiet without --json, as ckecli");
    // An empty listing is its header on stdout, as every listing prints.
    let out = coord.ctl(&["fence", "list"])?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ID  MACHINE  NODE  STATE  SINCE  OFF  ON  FAILURE\n"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flows: Vec<Value> = coord.ctl_json(&["fence", "list", "--json"])?;
    assert!(flows.is_empty());
    // The human output keeps its table.
    let out = coord.ctl(&["machines", "list"])?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("10.0.3.1"));

    // `machines clear` says whether the machine needed a human, and refuses an unknown one.
    let cleared: Cleared = coord.ctl_json(&["machines", "clear", "10.0.3.1", "--json"])?;
    assert_eq!(cleared.address, "10.0.3.1");
    assert!(
        !cleared.was_needs_human,
        "paused, not needs-human: {cleared:?}"
    );
    let out = coord.ctl(&["machines", "clear", "10.0.3.1"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("was not held as needs-human"), "{text}");
    let e = coord
        .ctl(&["machines", "clear", "10.9.9.9"])
        .expect_err("an unknown address is refused");
    assert!(
        format!("{e:#}").contains("no machine with address or hostname 10.9.9.9"),
        "{e:#}"
    );

    // Machines are named by hostname as well as by address.
    let by_name: MachineDetail = coord.ctl_json(&["machines", "show", "j1", "--json"])?;
    assert_eq!(by_name.summary.spec.address, "10.0.3.1");
    let events: Vec<JournalLine> = coord.ctl_json(&["events", "--machine", "j1", "--json"])?;
    assert!(
        events.iter().any(|l| l.address == "10.0.3.1"),
        "events --machine j1: {events:?}"
    );
    // A name no machine has is refused, not answered with an empty table.
    let e = coord
        .ctl(&["events", "--machine", "j9"])
        .expect_err("an unknown machine is refused");
    assert!(
        format!("{e:#}").contains("no machine with address or hostname j9"),
        "{e:#}"
    );
    let cleared: Cleared = coord.ctl_json(&["machines", "clear", "j1", "--json"])?;
    assert_eq!(cleared.address, "10.0.3.1");
    let e = coord
        .ctl(&["machines", "show", "no-such-host"])
        .expect_err("an unknown hostname is refused");
    assert!(
        format!("{e:#}").contains("no machine with address or hostname no-such-host"),
        "{e:#}"
    );

    // `events --follow --json` streams: one object per line, repeats included (the paused
    // hold is made again every pass, its count growing).
    let mut follow = coord
        .ctl_command(&["events", "--follow", "--json", "--machine", "j1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = BufReader::new(follow.stdout.take().expect("stdout is piped"));
    let mut held = Vec::new();
    while held.len() < 2 {
        let mut line = String::new();
        anyhow::ensure!(out.read_line(&mut line)? > 0, "events --follow ended");
        let l: JournalLine = serde_json::from_str(&line)?;
        if l.rule == "paused" {
            held.push(l.count);
        }
    }
    assert!(
        held[1] > held[0],
        "the repeat arrives while following: {held:?}"
    );
    drop(out);
    let status = wait_for("events --follow to end after its reader", SETTLE, || {
        follow
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "running".to_string())
    })?;
    assert!(status.success(), "{status}");

    // A follow goes on through a coordinator restart (an upgrade, a config change) and a
    // crash (kill -9, restarted by systemd): it says on stderr that it lost the coordinator,
    // and why, connects again, and streams on.
    let err_path = coord.dir.join("follow.stderr");
    let mut follow = coord
        .ctl_command(&[
            "--timeout",
            "3s",
            "events",
            "--follow",
            "--json",
            "--machine",
            "j1",
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()?;
    let mut out = BufReader::new(follow.stdout.take().expect("stdout is piped"));
    let next_paused = |out: &mut BufReader<std::process::ChildStdout>| -> anyhow::Result<u64> {
        loop {
            let mut line = String::new();
            anyhow::ensure!(out.read_line(&mut line)? > 0, "events --follow ended");
            let l: JournalLine = serde_json::from_str(&line)?;
            if l.rule == "paused" {
                return Ok(l.count);
            }
        }
    };
    let before = next_paused(&mut out)?;
    coord.restart()?;
    let after = loop {
        let n = next_paused(&mut out)?;
        if n > before {
            break n;
        }
    };
    assert!(after > before);
    // Killed, and down for longer than the follow's --timeout: its poll gets no answer.
    if let Some(mut p) = coord.proc.take() {
        p.sigkill();
    }
    std::thread::sleep(Duration::from_secs(5));
    coord.restart()?;
    loop {
        if next_paused(&mut out)? > after {
            break;
        }
    }
    assert!(follow.try_wait()?.is_none(), "still following");
    let _ = follow.kill();
    let _ = follow.wait();
    let err = std::fs::read_to_string(&err_path)?;
    assert!(
        err.contains("lost the coordinator (the coordinator said: coordinator shutting down)")
            && err.matches("lost the coordinator").count() == 2
            && err.matches("connected to the coordinator again").count() == 2,
        "{err}"
    );

    // And it ends when its reader goes (`| head`) even with nothing new to print, which it
    // learns from the pipe, not from a write.
    let mut quiet = coord
        .ctl_command(&["events", "--follow", "--since", "2999-01-01T00:00:00Z"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    assert!(quiet.try_wait()?.is_none(), "a follow runs until stopped");
    drop(quiet.stdout.take());
    let status = wait_for(
        "a silent events --follow to end after its reader",
        Duration::from_secs(5),
        || {
            quiet
                .try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "running".to_string())
        },
    );
    if status.is_err() {
        let _ = quiet.kill();
    }
    assert!(status?.success());
    Ok(())
}
