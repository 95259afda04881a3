//! Reports never write the store (`docs/design.md`: a report changes the coordinator's
//! memory, and only a state change is written): 50 simulated agents report every 300 ms to a
//! coordinator on a real etcd (`fleet-sim --store etcd`), and etcd's revision, which any
//! write anywhere in the cluster moves, is the same at both ends of the window; once two
//! agents are killed, their machines' transitions do move it (the read sees the writes).
//! The 1,000-agent figure is in `docs/benchmarks.md`, "The store: SQLite and etcd".

use anyhow::Context;
use serde_json::Value;
use testkit::procs::{bin_dir, command};

#[test]
fn reports_do_not_move_etcds_revision_and_state_changes_do() -> anyhow::Result<()> {
    let out = command("fleet-sim")
        .env("FLEETMEND_BIN_DIR", bin_dir())
        .args([
            "--agents",
            "50",
            "--interval",
            "300ms",
            "--duration",
            "3s",
            "--kill-percent",
            "4",
            "--store",
            "etcd",
            "--json",
        ])
        .output()
        .context("cannot run fleet-sim")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fleet-sim failed: {stderr}");
    let r: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("fleet-sim printed no JSON; stderr: {stderr}"))?;
    assert_eq!(r["store"], "etcd", "{r:#}");
    assert_eq!(r["dropped"], 0, "{r:#}");
    assert!(r["reports_acked"].as_u64().unwrap_or(0) >= 250, "{r:#}");
    let (start, end) = (
        r["etcd_revision"][0].as_i64().context("no revision")?,
        r["etcd_revision"][1].as_i64().context("no revision")?,
    );
    assert!(start > 0, "{r:#}");
    assert_eq!(start, end, "reports wrote to etcd: {r:#}");
    let after = r["etcd_revision_after_kill"]
        .as_i64()
        .context("no revision")?;
    assert!(
        after > end,
        "the killed machines' transitions were not seen: {r:#}"
    );
    assert_eq!(r["healthy_after_kill"], 48, "{r:#}");
    Ok(())
}
