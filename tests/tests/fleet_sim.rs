//! The fleet simulator (`fleet-sim`, the scale benchmark's program) on a small fleet: 50
//! simulated agents with their own certificates against a real coordinator process must all
//! connect, have their reports acked at the offered rate, drop no connection, and see the
//! two agents it kills counted unreachable by the coordinator, not before their grace ran
//! out. The full-size runs are `scripts/fleet-sim.sh` (figures in `docs/benchmarks.md`).
//! Also `cycle-floor`, the footprint benchmark's kernel floor of an agent's report cycle.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use testkit::procs::{bin_dir, command};

/// A few seconds of work; generous for a loaded machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn a_small_fleet_connects_reports_and_its_killed_agents_are_detected() -> anyhow::Result<()> {
    let mut cmd = command("fleet-sim");
    cmd.env("FLEETMEND_BIN_DIR", bin_dir())
        .args([
            "--agents",
            "50",
            "--interval",
            "300ms",
            "--duration",
            "3s",
            "--kill-percent",
            "4",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().context("cannot start fleet-sim")?;
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let deadline = Instant::now() + RUN_TIMEOUT;
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
            anyhow::bail!("fleet-sim did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = waiter.join().expect("waiter thread")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fleet-sim failed: {stderr}");
    let r: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("fleet-sim printed no JSON; stderr: {stderr}"))?;
    let num = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {r:#}"))
    };

    assert_eq!(num("agents"), 50.0);
    assert_eq!(num("connected"), 50.0, "{r:#}");
    assert_eq!(num("dropped"), 0.0, "{r:#}");
    assert_eq!(num("healthy_at_window_end"), 50.0, "{r:#}");
    // 50 agents every 300 ms offer 166.7 reports/s; on a loaded machine half of that still
    // shows every agent reporting, and the coordinator's own counter must agree.
    let offered = num("reports_offered_per_s");
    assert!((offered - 50.0 / 0.3).abs() < 0.1, "{r:#}");
    assert!(num("reports_per_s") > offered / 2.0, "{r:#}");
    assert!(num("coordinator_reports_per_s") > offered / 2.0, "{r:#}");
    assert!(num("reports_acked") >= 250.0, "{r:#}");
    let (p50, p99, max) = (
        num("latency_p50_ms"),
        num("latency_p99_ms"),
        num("latency_max_ms"),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{r:#}");
    assert!(num("coordinator_cpu_us_per_report") > 0.0, "{r:#}");
    assert!(
        num("coordinator_rss_kib") > num("coordinator_rss_base_kib"),
        "{r:#}"
    );
    assert!(num("connect_s") > 0.0 && num("cert_issue_s") > 0.0, "{r:#}");

    // 4 % of 50: two agents killed at once. Each had reported at most one interval (plus
    // jitter) before the kill, so the coordinator cannot count them unreachable earlier than
    // the grace minus that interval; when it did, only they are missing.
    assert_eq!(num("killed"), 2.0, "{r:#}");
    let grace = num("unreachable_grace_s");
    assert!((grace - 0.9).abs() < 1e-9, "{r:#}");
    let detect = r["detect_s"]
        .as_f64()
        .with_context(|| format!("killed agents not detected: {r:#}"))?;
    assert!(detect >= grace - 0.3 * 1.05 - 0.01, "{r:#}");
    assert_eq!(num("healthy_after_kill"), 48.0, "{r:#}");
    assert_eq!(num("others_unreachable"), 0.0, "{r:#}");
    Ok(())
}

#[test]
fn fleet_sim_refuses_bad_options_and_a_missing_bin_dir() -> anyhow::Result<()> {
    let out = command("fleet-sim")
        .env("FLEETMEND_BIN_DIR", bin_dir())
        .args(["--interval", "5"])
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unit"),
        "{out:?}"
    );
    let out = command("fleet-sim")
        .env("FLEETMEND_BIN_DIR", bin_dir())
        .args(["--store", "postgres"])
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--store is sqlite or etcd, not \"postgres\""),
        "{out:?}"
    );
    // `command` keeps FLEETMEND_* variables from the child.
    let out = command("fleet-sim").args(["--agents", "5"]).output()?;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("FLEETMEND_BIN_DIR"),
        "{out:?}"
    );
    Ok(())
}

/// `cycle-floor`, the footprint benchmark's kernel floor of a report cycle, does its cycles
/// and prints a per-cycle CPU time it measured; bad options are refused by name.
#[test]
fn cycle_floor_measures_its_cycles_and_refuses_bad_options() -> anyhow::Result<()> {
    let out = command("cycle-floor")
        .args(["--interval", "20ms", "--cycles", "20", "--nic", "lo"])
        .stdin(Stdio::null())
        .output()
        .context("cannot run cycle-floor")?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ms: f64 = text
        .strip_prefix("cycle-floor: ")
        .and_then(|t| t.split(' ').next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no figure in {text:?}"))?;
    // Real work was measured: more than nothing, less than the 20 ms interval itself.
    assert!(ms > 0.0 && ms < 20.0, "{text}");
    assert!(
        text.contains("20 cycles at 20ms; nics lo; 7 files, 1 mounts"),
        "{text}"
    );
    for (args, says) in [
        (&["--cycles", "3"][..], "--cycles must be at least 10"),
        (&["--interval", "soon"][..], "--interval \"soon\""),
        (&["--bogus"][..], "unknown argument \"--bogus\""),
    ] {
        let out = command("cycle-floor").args(args).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    Ok(())
}
