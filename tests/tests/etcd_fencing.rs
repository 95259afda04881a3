//! Issue 30's end to end on etcd, with real processes: a coordinator started with
//! `[store] backend = "etcd"` on the test kit's etcd, a real bmc-gateway in front of OpenIPMI's
//! `ipmi_sim`, a node-agent, and the fake Kubernetes API server, through the same rig as
//! `fencing.rs` (`fence_rig`), with the store as its one difference:
//! - the dead-machine story (`fencing.rs`'s body): found dead by automatic remediation,
//!   powered off, released after the off, powered on, restored;
//! - etcd stopped under the running coordinator: `/healthz` turns 503 naming etcd, the
//!   leader steps down within its lease TTL and exits 75, started again it waits for etcd,
//!   a machine that dies meanwhile gets no power request, and once etcd is back the
//!   coordinator leads again and the machine is fenced with one off and one on;
//! - the coordinator SIGKILLed in the middle of a fence flow (the power-off sent and
//!   committed): started again, it resumes the flow from etcd, one off and one on at the BMC,
//!   no release before the off.
//!
//! Named `etcd_*` so `scripts/test.sh` runs it after the Go build that makes etcd. Needs
//! `ipmi_sim` and `ipmitool` (scripts/setup-test-deps.sh installs them).

mod fence_rig;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fence_rig::*;
use testkit::etcd::{Etcd, Options, fresh_prefix, shared};
use testkit::procs::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_machine_is_fenced_released_and_restored_with_the_store_on_etcd() -> Result<()> {
    let etcd = shared()?;
    let tuning = Tuning::quick(true).on_etcd(&etcd.endpoints(), &fresh_prefix("story"));
    dead_machine_story(tuning).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_after_the_power_off_resumes_the_flow_from_etcd() -> Result<()> {
    let etcd = shared()?;
    let tuning = Tuning::quick(false).on_etcd(&etcd.endpoints(), &fresh_prefix("crash"));
    let outcome = crash_at_with(tuning, "after:power-off").await?;
    eprintln!("after:power-off on etcd: {outcome}");
    Ok(())
}

/// etcd stopped under a running coordinator: `/healthz` says so, nothing is powered while it
/// is down, and the repair goes on once it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_under_the_coordinator_holds_every_power_request_until_it_returns()
-> Result<()> {
    // Its own etcd: this test stops it.
    let mut etcd = blocking(|| Etcd::start(Options::default()))?;
    // A short lease: the coordinator steps down sooner, and leads sooner once etcd returns.
    let tuning = Tuning::quick(true)
        .on_etcd(&etcd.endpoints(), "/fleetmend")
        .with_lease_ttl("3s");
    let mut rig = Rig::start_tuned(tuning, REPAIR_YML, None).await?;
    let (code, body) = blocking(|| rig.coord.http_get("/healthz"))?;
    assert_eq!(code, 200, "{body}");

    blocking(|| etcd.stop(0))?;
    let reason = blocking(|| {
        wait_for(
            "/healthz to turn 503 with etcd stopped",
            SETTLE,
            || match rig.coord.http_get("/healthz") {
                Ok((503, body)) => Ok(body),
                other => Err(format!("{other:?}")),
            },
        )
    })?;
    assert!(
        reason.contains("etcd") && reason.contains(&etcd.endpoints()[0]),
        "the reason names etcd and its endpoint: {reason}"
    );

    // The machine dies while etcd is down: detected (its agent silent, its Lease stale) but
    // nothing can be recorded, so nothing is acted on. Its keep-alives unanswered, the
    // leader stops acting within its lease TTL (10 s by default) and exits 75 for systemd
    // to start it again.
    rig.kill_machine();
    let outage = Instant::now();
    let code = loop {
        rig.assert_no_power();
        let proc = rig.coord.proc.as_mut().context("coordinator")?;
        if let Some(st) = proc.try_exit() {
            break st.code();
        }
        if outage.elapsed() > Duration::from_secs(25) {
            bail!(
                "the leader did not step down with etcd down:\n{}",
                proc.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = rig.coord.log_text();
    assert_eq!(code, Some(75), "the deposed leader's exit status:\n{log}");
    assert!(log.contains("no longer leads"), "{log}");
    let stepped_down = outage.elapsed();
    // systemd starts it again: it waits for etcd, acting on nothing.
    blocking(|| rig.coord.respawn_after_exit())?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.assert_no_power();
    let proc = rig.coord.proc.as_mut().context("coordinator")?;
    assert!(
        proc.try_exit().is_none(),
        "the coordinator gave up waiting for etcd:\n{}",
        proc.log_text()
    );
    assert!(
        proc.log_text().contains("cannot start without etcd"),
        "{}",
        proc.log_text()
    );

    blocking(|| etcd.restart(0))?;
    blocking(|| rig.coord.wait_leading(SETTLE))?;
    // The coordinator that now leads has not heard from the dead machine since it started:
    // remediation would give it the start's grace (its agent may be reconnecting; 60 s
    // more, docs/install.md "What a failover costs"). Queued by hand, as an operator who
    // knows it is dead would.
    rig.enqueue_unreachable()?;
    rig.fence_completes()?;
    let off = rig.first_power("0").context("never powered off")?;
    for (at, what) in rig.node_writes() {
        assert!(at > off, "{what} came before the simulator powered off");
    }
    eprintln!(
        "etcd down: the leader stepped down after {stepped_down:.1?} and no power request was sent; fenced after etcd returned"
    );
    Ok(())
}
