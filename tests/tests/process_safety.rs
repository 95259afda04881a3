//! Issue 8's process-safety "must show", with real processes:
//! - a second coordinator on the same database is refused, naming the lock file and the pid
//!   holding it, while the first keeps serving; `coordinator check` of the same file under
//!   another name (a hard link) names the holder too;
//! - SIGKILL of the coordinator while a repair command runs (a script that records its pids
//!   and sleeps), then a restart: exactly one copy of the command runs, and the entry's
//!   history says the old process group was killed;
//! - a database that cannot be written refuses the start with the path (missing directory,
//!   a directory on procfs, a database file bind-mounted read-only in a private mount
//!   namespace: all of which fail for root too);
//! - a database that stops taking writes while running turns `/healthz` to 503 with the
//!   reason and counts the failures in `/metrics`, back to 200 once writes work; a request
//!   stuck behind the store times out in `coordinatorctl` saying the outcome is unknown;
//! - SIGHUP: the coordinator puts a renewed certificate in place for new connections (and
//!   refuses a broken one), the agent reloads (and refuses a broken configuration) and keeps
//!   reporting, the gateway reloads its TLS files and keeps answering.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use protocol::Role;
use protocol::gateway::{PowerAction, PowerRequest};
use serde_json::Value;
use testkit::bmc_sim::{GatewayClient, GatewayProc, TestPki};
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{
    Coordinator, CoordinatorOptions, Pki, Proc, bin, command, free_tcp_port, free_udp_port,
    inventory_toml, metric, start_agent, wait_for,
};

/// Bound for anything the test causes (processes start in seconds on a loaded machine).
const SETTLE: Duration = Duration::from_secs(40);

fn send_signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let st = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()?;
    ensure!(st.success(), "kill -{sig} {pid} failed");
    Ok(())
}

/// A process that is running and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next())
        })
        .flatten()
        .is_some_and(|state| state != 'Z')
}

fn pids_in(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A copy of `coord`'s configuration on fresh ports, with `database` if given.
fn variant_config(
    coord: &Coordinator,
    name: &str,
    database: Option<&Path>,
) -> anyhow::Result<PathBuf> {
    let quic = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let http = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()));
    let mut text = std::fs::read_to_string(&coord.config)?
        .replace(&coord.quic.to_string(), &quic.to_string())
        .replace(&coord.http.to_string(), &http.to_string());
    if let Some(db) = database {
        let current = format!("{:?}", coord.dir.join("coordinator.db").to_string_lossy());
        ensure!(
            text.contains(&current),
            "config names no database {current}"
        );
        text = text.replace(&current, &format!("{:?}", db.to_string_lossy()));
    }
    let path = coord.dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Runs `cmd` (a coordinator that is expected to refuse to start) and returns its exit code
/// and log; fails if it is still running after [`SETTLE`].
fn refused(name: &str, cmd: Command, log: &Path) -> anyhow::Result<(Option<i32>, String)> {
    let mut p = Proc::spawn(name, cmd, log)?;
    let status = wait_for(&format!("{name} to exit"), SETTLE, || {
        p.try_exit().ok_or_else(|| "still running".to_string())
    })?;
    Ok((status.code(), p.log_text()))
}

/// A coordinator's store frozen from another process, as a full disk would: SQLite triggers
/// abort the chosen writes with `why` until [`Frozen::thaw`].
struct Frozen {
    db: rusqlite::Connection,
    triggers: Vec<String>,
}

impl Frozen {
    /// Aborts every `(operation, table)` write, e.g. `("UPDATE", "machines")`.
    fn store(coord: &Coordinator, writes: &[(&str, &str)], why: &str) -> anyhow::Result<Self> {
        let db = rusqlite::Connection::open(coord.dir.join("coordinator.db"))?;
        db.busy_timeout(Duration::from_secs(10))?;
        let mut triggers = Vec::new();
        for (op, table) in writes {
            let name = format!("freeze_{}_{table}", op.to_lowercase());
            db.execute_batch(&format!(
                "CREATE TRIGGER {name} BEFORE {op} ON {table} BEGIN SELECT RAISE(ABORT, '{why}'); END;"
            ))?;
            triggers.push(name);
        }
        Ok(Self { db, triggers })
    }

    /// Lets the writes through again; returns the connection, for more of the same.
    fn thaw(self) -> anyhow::Result<rusqlite::Connection> {
        for t in &self.triggers {
            self.db.execute_batch(&format!("DROP TRIGGER {t};"))?;
        }
        Ok(self.db)
    }
}

#[test]
fn second_coordinator_on_one_database_is_refused_naming_the_lock_and_pid() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let first = coord
        .proc
        .as_ref()
        .and_then(Proc::pid)
        .context("first pid")?;
    let cfg = variant_config(&coord, "second.toml", None)?;
    let mut cmd = command("coordinator");
    cmd.arg("--config").arg(&cfg);
    let (code, log) = refused("second coordinator", cmd, &coord.dir.join("second.log"))?;
    assert_eq!(code, Some(1), "{log}");
    let lock = coord.dir.join("coordinator.db.lock");
    assert!(
        log.contains(&lock.display().to_string()),
        "names the lock: {log}"
    );
    assert!(
        log.contains(&format!("pid {first}")),
        "names the holder {first}: {log}"
    );
    assert!(!log.contains("coordinator serving"), "{log}");
    // `coordinator check` of a configuration that names the same file under another name (a
    // hard link) says what a coordinator started with it would: the file is held, by whom.
    // A copy through that name would miss the first one's newest writes, in its `-wal`.
    let hard = coord.dir.join("hard.db");
    std::fs::hard_link(coord.dir.join("coordinator.db"), &hard)?;
    let cfg = variant_config(&coord, "hard.toml", Some(&hard))?;
    let out = command("coordinator")
        .arg("check")
        .arg("--config")
        .arg(&cfg)
        .stdin(std::process::Stdio::null())
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(64), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("database")
            && l.contains("FAIL")
            && l.contains(&format!(
                "is in use by another coordinator (pid {first}) that opened the same file under another name"
            ))),
        "{text}"
    );
    assert!(!text.contains("no such table"), "{text}");
    let (status, body) = coord.http_get("/healthz")?;
    assert_eq!(
        (status, body.trim()),
        (200, "ok"),
        "the first one still serves"
    );
    Ok(())
}

const SLOW_REPAIR: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["slow"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "echo $$ >> @D@/leaders; sleep 300 & echo $! >> @D@/sleeps; wait", "slow"]
              command_timeout_seconds: 0
          health_check_command: ["sh", "-c", "echo false"]
"#;

/// Kills, when dropped (also when the test fails), every process group whose leader's pid
/// is in one of `files` and every process whose pid is in one of them, if it still runs
/// `sh` or `sleep` (a recycled pid is left alone): a failing test leaves no `sleep 300`.
struct KillListedOnDrop(Vec<PathBuf>);

impl Drop for KillListedOnDrop {
    fn drop(&mut self) {
        for pid in self.0.iter().flat_map(|f| pids_in(f)) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let ours = [&b"sh\0"[..], b"sleep\0"]
                .iter()
                .any(|p| cmdline.starts_with(p));
            if ours && alive(pid) {
                // The leader's group first (the script and its sleep), then the pid itself.
                let _ = send_signal_quiet(&format!("-{pid}"));
                let _ = send_signal_quiet(&pid.to_string());
            }
        }
    }
}

fn send_signal_quiet(target: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args(["-KILL", "--", target])
        .stderr(std::process::Stdio::null())
        .status()
}

#[test]
fn sigkill_mid_command_then_restart_runs_exactly_one_copy() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let _cleanup = KillListedOnDrop(vec![dir.join("leaders"), dir.join("sleeps")]);
    let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
    let cluster = dir.join("cluster.yml");
    std::fs::write(
        &cluster,
        SLOW_REPAIR.replace("@D@", &dir.display().to_string()),
    )?;
    let opts = CoordinatorOptions {
        extra: format!("[repair]\nconfig = {:?}\n", cluster.display().to_string()),
        ..Default::default()
    };
    let mut coord = Coordinator::start(&dir.join("coord"), &pki, &opts)?;
    coord.ctl(&[
        "repair-queue",
        "add",
        "--force",
        "unreachable",
        "slow",
        "10.0.0.9",
    ])?;
    let (leaders, sleeps) = (dir.join("leaders"), dir.join("sleeps"));
    let first = wait_for("the repair command to start", SETTLE, || {
        match (pids_in(&leaders).as_slice(), pids_in(&sleeps).as_slice()) {
            ([l], [s]) => Ok((*l, *s)),
            other => Err(format!("{other:?}")),
        }
    })?;
    assert!(alive(first.0) && alive(first.1));

    coord.proc.take().context("running")?.sigkill();
    // The script's sleep is not the coordinator's child: nothing but the next coordinator
    // (or the parent-death signal, which reaches only the script) stops it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        alive(first.1),
        "the old command's sleep survives a SIGKILLed coordinator"
    );

    coord.restart()?;
    let second = wait_for("the command to run again", SETTLE, || {
        match (pids_in(&leaders).as_slice(), pids_in(&sleeps).as_slice()) {
            ([_, l], [_, s]) => Ok((*l, *s)),
            other => Err(format!("{other:?}")),
        }
    })?;
    assert!(
        !alive(first.0) && !alive(first.1),
        "the old copy was killed first"
    );
    assert!(alive(second.0) && alive(second.1), "the new copy runs");
    let running: Vec<u32> = pids_in(&sleeps).into_iter().filter(|p| alive(*p)).collect();
    assert_eq!(
        running,
        vec![second.1],
        "exactly one copy of the command runs"
    );

    let show: Value = coord.ctl_json(&["repair-queue", "show", "1", "--json"])?;
    let history = show["history"].as_array().context("history")?;
    let killed = history
        .iter()
        .find(|h| h["event"] == "orphan-killed")
        .with_context(|| format!("no orphan-killed event: {history:?}"))?;
    let detail = killed["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!(
            "killed process group {} left by the previous coordinator",
            first.0
        )),
        "{detail}"
    );
    let pos = |ev: &str| history.iter().rposition(|h| h["event"] == ev);
    assert!(
        pos("orphan-killed") < pos("command-started"),
        "killed before the step ran again: {history:?}"
    );
    // Clean stop: the new copy dies with its group.
    let code = coord.proc.take().context("running")?.sigterm(SETTLE)?;
    assert_eq!(code, Some(0));
    wait_for("the command to die with a clean stop", SETTLE, || {
        if alive(second.1) {
            Err("still running".into())
        } else {
            Ok(())
        }
    })?;
    Ok(())
}

#[test]
fn unwritable_database_refuses_to_start_naming_the_path() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let mut coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let code = coord.proc.take().context("running")?.sigterm(SETTLE)?;
    assert_eq!(code, Some(0));
    let start = |name: &str, db: &Path| -> anyhow::Result<(Option<i32>, String)> {
        let cfg = variant_config(&coord, &format!("{name}.toml"), Some(db))?;
        let mut cmd = command("coordinator");
        cmd.arg("--config").arg(cfg);
        refused(name, cmd, &coord.dir.join(format!("{name}.log")))
    };

    let missing = coord.dir.join("no-such-dir");
    let (code, log) = start("missing", &missing.join("c.db"))?;
    assert_eq!(code, Some(64), "{log}");
    assert!(
        log.contains(&format!("the directory {} is missing", missing.display())),
        "{log}"
    );

    // procfs takes no new files, not even from root.
    let (code, log) = start("procfs", Path::new("/proc/fleetmend-e2e.db"))?;
    assert_eq!(code, Some(64), "{log}");
    assert!(log.contains("/proc is not writable"), "{log}");

    // The real database, made read-only by a read-only bind mount of the file in a private
    // mount namespace (root ignores file modes, not read-only mounts).
    let db = coord.dir.join("coordinator.db");
    let cfg = variant_config(&coord, "readonly.toml", None)?;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
        .arg(r#"mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; shift; exec "$@""#)
        .arg("sh")
        .arg(&db)
        .arg(bin("coordinator"))
        .arg("--config")
        .arg(&cfg)
        .env("NO_COLOR", "1");
    let (code, log) = refused("readonly", cmd, &coord.dir.join("readonly.log"))?;
    if log.contains("mount:") || log.contains("unshare:") {
        bail!(
            "this test needs root with CAP_SYS_ADMIN (a CI VM, not an unprivileged container): {log}"
        );
    }
    assert_eq!(code, Some(64), "{log}");
    assert!(
        log.contains(&format!("{} is not writable", db.display())),
        "{log}"
    );
    assert!(!log.contains("coordinator serving"), "{log}");

    // The same database, writable again, starts.
    coord.restart()?;
    Ok(())
}

#[test]
fn store_that_stops_taking_writes_turns_healthz_503_and_back() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let ctl = |args: &[&str]| {
        let mut cmd = command("coordinatorctl");
        cmd.arg("--server")
            .arg(coord.quic.to_string())
            .arg("--ca")
            .arg(&coord.admin.ca)
            .arg("--cert")
            .arg(&coord.admin.cert)
            .arg("--key")
            .arg(&coord.admin.key)
            .args(args);
        cmd.output()
    };
    let add = |addr: &str, host: &str, timeout: &str| {
        ctl(&[
            "--timeout",
            timeout,
            "machines",
            "add",
            addr,
            "--hostname",
            host,
            "--type",
            "qemu",
        ])
    };
    let ok = add("10.0.0.50", "n50", "30s")?;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    // Another process freezes the store: every write to the machines table aborts.
    let frozen = Frozen::store(
        &coord,
        &[("INSERT", "machines"), ("UPDATE", "machines")],
        "frozen by the test",
    )?;
    let failed = add("10.0.0.51", "n51", "30s")?;
    assert!(!failed.status.success(), "the write must fail");
    let (status, body) = coord.http_get("/healthz")?;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("database writes are failing") && body.contains("frozen by the test"),
        "{body}"
    );
    let (_, metrics) = coord.http_get("/metrics")?;
    assert!(
        metric(&metrics, "fleetmend_store_failures_total").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "fleetmend_store_failing"),
        Some(1.0),
        "{metrics}"
    );
    // What coordinatorctl shows meanwhile is as last written, and it says so beside the
    // answer (on stderr: the table and --json stay as they are).
    let list = ctl(&["machines", "list"])?;
    let (out, err) = (
        String::from_utf8_lossy(&list.stdout),
        String::from_utf8_lossy(&list.stderr),
    );
    assert!(list.status.success(), "{err}");
    assert!(
        out.contains("10.0.0.50") && !out.contains("WARNING"),
        "{out}"
    );
    assert!(
        err.contains("WARNING: the coordinator cannot write its database")
            && err.contains("frozen by the test")
            && err.contains("as last written"),
        "{err}"
    );
    let json = ctl(&["machines", "list", "--json"])?;
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert_eq!(parsed.as_array().map(Vec::len), Some(1), "{parsed}");

    let db = frozen.thaw()?;
    let ok = add("10.0.0.51", "n51", "30s")?;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let list = ctl(&["machines", "list"])?;
    let err = String::from_utf8_lossy(&list.stderr);
    assert!(list.status.success() && err.is_empty(), "{err}");
    let (status, body) = coord.http_get("/healthz")?;
    assert_eq!((status, body.trim()), (200, "ok"));
    let (_, metrics) = coord.http_get("/metrics")?;
    assert_eq!(
        metric(&metrics, "fleetmend_store_failing"),
        Some(0.0),
        "{metrics}"
    );

    // A writer holding the database stalls the coordinator's write (SQLite's busy wait):
    // coordinatorctl gives up after --timeout and says the outcome is unknown.
    db.execute_batch("BEGIN IMMEDIATE")?;
    let stuck = add("10.0.0.52", "n52", "1s")?;
    db.execute_batch("ROLLBACK")?;
    assert!(!stuck.status.success());
    let err = String::from_utf8_lossy(&stuck.stderr);
    assert!(err.contains("the outcome is unknown"), "{err}");
    assert!(err.contains("coordinatorctl machines list"), "{err}");
    Ok(())
}

/// A store that keeps refusing writes (a full disk) fails every health sweep and every
/// repair queue tick, several a second: the coordinator says so once (and once a minute),
/// not at every one, and a change it cannot store is not logged as made; the store working
/// again is logged, and so are the changes then.
#[test]
fn a_store_that_keeps_failing_is_logged_once_not_at_every_sweep() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let repair = tmp.path().join("repair.yml");
    std::fs::write(
        &repair,
        "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [sh, -c, 'sleep 1']\n              watch_seconds: 1\n          health_check_command: [sh, -c, 'echo true']\n",
    )?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            report_interval: Duration::from_millis(300),
            unreachable_grace: Duration::from_millis(900),
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            extra: format!("[repair]\nconfig = {:?}\n", repair.display().to_string()),
            ..Default::default()
        },
    )?;
    let fixture = NodeFixture::builder("node-1")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(Duration::from_millis(300)),
    )?;
    let mut agent = start_agent("node-1", &cfg, &tmp.path().join("agent.log"))?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    // A repair whose command is running when the disk fills: its end cannot be stored.
    coord.ctl(&["repair-queue", "add", "unhealthy", "10.0.0.1"])?;
    let frozen = Frozen::store(
        &coord,
        &[("UPDATE", "machines"), ("UPDATE", "repair_queue_entries")],
        "disk full, says the test",
    )?;
    agent.sigkill();
    // The grace passes: every sweep (several a second) now decides `unreachable` and fails
    // to store it.
    coord.wait_for_log(&["health sweep failed", "disk full, says the test"], SETTLE)?;
    coord.wait_for_log(
        &["cannot commit transitions", "disk full, says the test"],
        SETTLE,
    )?;
    std::thread::sleep(Duration::from_secs(3));
    let log = coord.log_text();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("health sweep failed"), 1, "{log}");
    assert_eq!(count("cannot commit transitions"), 1, "{log}");
    assert_eq!(count("to=unreachable"), 0, "not stored, not logged:\n{log}");
    let finished = |l: &&str| l.contains("event=\"command-succeeded\"");
    assert_eq!(log.lines().filter(finished).count(), 0, "{log}");
    frozen.thaw()?;
    coord.wait_for_state("node-1", "unreachable", SETTLE)?;
    coord.wait_for_log(&["health sweep works again"], SETTLE)?;
    coord.wait_for_log(&["repair queue: commits work again"], SETTLE)?;
    let log = coord.log_text();
    let changed = log
        .lines()
        .filter(|l| l.contains("machine state changed") && l.contains("to=unreachable"))
        .count();
    assert_eq!(changed, 1, "{log}");
    Ok(())
}

/// Issue 34 item 3: a quiet coordinator (nothing changes, so nothing is written) learns that
/// its store stopped taking writes from its own probe, within a probe period, and that it
/// works again the same way; `/healthz` says what failed in words an operator can act on.
/// While the store is down, an agent whose every report carries a change that cannot be
/// stored does not make one ERROR line per report: the store says it once.
#[test]
fn a_quiet_coordinator_probes_its_store_and_a_failing_store_is_said_once() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            report_interval: Duration::from_millis(300),
            unreachable_grace: Duration::from_secs(3),
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            ..Default::default()
        },
    )?;
    let fixture = NodeFixture::builder("node-1")
        .nic("eth0")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(Duration::from_millis(300)),
    )?;
    let _agent = start_agent("node-1", &cfg, &tmp.path().join("agent.log"))?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    let healthz = |want: u16| {
        wait_for(
            &format!("/healthz {want}"),
            Duration::from_secs(20),
            || match coord.http_get("/healthz") {
                Ok((status, body)) if status == want => Ok(body),
                Ok((status, body)) => Err(format!("{status} {body}")),
                Err(e) => Err(e.to_string()),
            },
        )
    };
    assert_eq!(healthz(200)?.trim(), "ok");

    // Nothing changes in the fleet, so only the probe writes.
    let frozen = Frozen::store(
        &coord,
        &[("UPDATE", "store_identity")],
        "frozen by the test",
    )?;
    let body = healthz(503)?;
    assert!(
        body.contains("database writes are failing: a trigger on")
            && body.contains("refused the write")
            && body.contains("frozen by the test"),
        "{body}"
    );
    frozen.thaw()?;
    assert_eq!(healthz(200)?.trim(), "ok");
    coord.wait_for_log(&["database writes work again"], SETTLE)?;

    // Every report now carries a transition (eth0 lost its carrier) the store refuses.
    let frozen = Frozen::store(
        &coord,
        &[("UPDATE", "machines"), ("UPDATE", "store_identity")],
        "disk full, says the test",
    )?;
    fixture.set_carrier("eth0", false)?;
    healthz(503)?;
    std::thread::sleep(Duration::from_secs(3));
    let log = coord.log_text();
    let count = |needle: &str| {
        log.lines()
            .filter(|l| l.contains(" ERROR ") && l.contains(needle))
            .count()
    };
    assert_eq!(count("cannot record state transition"), 0, "{log}");
    assert_eq!(
        count("database writes are failing"),
        2,
        "once per outage:\n{log}"
    );
    frozen.thaw()?;
    coord.wait_for_state("node-1", "unhealthy", SETTLE)?;
    assert_eq!(healthz(200)?.trim(), "ok");
    Ok(())
}

#[test]
fn sighup_keeps_coordinator_and_agent_running() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            ..Default::default()
        },
    )?;
    let fixture = NodeFixture::builder("node-1")
        .nic("eth0")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let agent_cfg = AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
        .report_interval(Duration::from_millis(300));
    let cfg_path = fixture.write_agent_config(&agent_cfg)?;
    let mut agent = start_agent("node-1", &cfg_path, &tmp.path().join("agent.log"))?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;
    let last_report = || -> anyhow::Result<u64> {
        coord
            .machines()?
            .into_iter()
            .find(|m| m.spec.hostname == "node-1")
            .and_then(|m| m.last_report_at)
            .map(testkit::ctl_json::ms)
            .context("node-1 has reported")
    };
    let reports_go_on = |agent: &mut Proc| -> anyhow::Result<()> {
        let before = last_report()?;
        wait_for("node-1 to report again", SETTLE, || match last_report() {
            Ok(t) if t > before => Ok(()),
            other => Err(format!("{other:?}")),
        })?;
        ensure!(
            agent.try_exit().is_none(),
            "agent exited: {}",
            agent.log_text()
        );
        Ok(())
    };

    // The coordinator's certificate renewed (20 days, so that it shows) and put in place
    // without a restart: /metrics says the new expiry, and a new admin connection works.
    let coord_pid = coord.proc.as_ref().and_then(Proc::pid).context("pid")?;
    let renew = |days: &str| {
        let out = command("coordinatorctl")
            .args(["pki", "issue", "--ca"])
            .arg(&pki.ca_dir)
            .args([
                "--role",
                "coordinator",
                "--name",
                "coord",
                "--ip",
                "127.0.0.1",
            ])
            .args(["--days", days, "--force", "--out"])
            .arg(&pki.certs_dir)
            .output()?;
        ensure!(out.status.success(), "{out:?}");
        Ok(())
    };
    renew("20")?;
    send_signal(coord_pid, "HUP")?;
    coord.wait_for_log(&["SIGHUP: TLS files reloaded"], SETTLE)?;
    assert_eq!(coord.http_get("/healthz")?.0, 200);
    let expiry = metric(
        &coord.scrape()?,
        "fleetmend_certificate_expiry_timestamp_seconds{certificate=\"coordinator\"}",
    )
    .context("coordinator certificate expiry")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    ensure!(
        (expiry - (now + 20.0 * 86_400.0)).abs() < 3600.0,
        "the renewed certificate (20 days) expires at {expiry}, now {now}"
    );
    coord.wait_for_log(
        &["the certificate expires in ", "reload the coordinator"],
        SETTLE,
    )?;
    coord.machines()?;
    // A certificate that does not go with its key is refused; the running one stays.
    std::fs::write(
        pki.certs_dir.join("coord.key"),
        std::fs::read(pki.certs_dir.join("tester.key"))?,
    )?;
    send_signal(coord_pid, "HUP")?;
    coord.wait_for_log(
        &[
            "SIGHUP: reload refused",
            "it is not the key of the certificate",
        ],
        SETTLE,
    )?;
    coord.machines()?;
    // A valid pair naming another identity is refused too: a reload never changes who the
    // coordinator is.
    for ext in ["crt", "key"] {
        std::fs::copy(
            pki.certs_dir.join(format!("tester.{ext}")),
            pki.certs_dir.join(format!("coord.{ext}")),
        )?;
    }
    send_signal(coord_pid, "HUP")?;
    coord.wait_for_log(
        &["SIGHUP: reload refused", "but this coordinator runs as"],
        SETTLE,
    )?;
    coord.machines()?;

    let agent_pid = agent.pid().context("agent pid")?;
    send_signal(agent_pid, "HUP")?;
    agent.wait_for_log(&["configuration and TLS files reloaded"], SETTLE)?;
    reports_go_on(&mut agent)?;

    // A broken configuration is refused; the agent goes on with what it had.
    std::fs::write(&cfg_path, "this is = not [valid toml")?;
    send_signal(agent_pid, "HUP")?;
    agent.wait_for_log(
        &["reload refused", "keeping the running configuration"],
        SETTLE,
    )?;
    reports_go_on(&mut agent)?;
    assert_eq!(coord.machine("10.0.0.1")?.summary.state, "healthy");
    // And the coordinator is still the same process.
    assert_eq!(coord.proc.as_ref().and_then(Proc::pid), Some(coord_pid));
    Ok(())
}

#[tokio::test]
async fn sighup_reloads_the_gateway_tls_and_it_keeps_answering() -> anyhow::Result<()> {
    let pki = TestPki::new()?;
    let gw = GatewayProc::start(&pki, "").await?;
    let pid = gw.pid().context("gateway pid")?;
    send_signal(pid, "HUP")?;
    let deadline = std::time::Instant::now() + SETTLE;
    while !gw.log().contains("TLS files reloaded") {
        ensure!(
            std::time::Instant::now() < deadline,
            "no reload logged: {}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        testkit::bmc_sim::http_get(gw.http, "/healthz")
            .await?
            .contains("ok")
    );
    // A new coordinator connection after the reload is served and answered.
    let c = GatewayClient::connect(
        &pki.material(Role::Coordinator, "coord-1")?,
        gw.quic,
        GatewayClient::coordinator_hello(),
    )
    .await?;
    let resp = c
        .request(
            PowerRequest {
                id: "hup-1".into(),
                address: "10.9.9.9".into(),
                serial: String::new(),
                action: PowerAction::Status,
                timeout_ms: 5_000,
            },
            SETTLE,
        )
        .await?;
    assert_eq!(resp.id, "hup-1", "{resp:?}");
    assert_eq!(gw.terminate().await?.code(), Some(0));
    Ok(())
}

/// A daemon whose log reader goes away (the journal restarting, a `| tee` killed) keeps
/// running: its log lines are dropped, it does not stop, and certainly not with status 0,
/// which `Restart=on-failure` would leave stopped. The coordinator and the agent (the two
/// builds of the logging set-up) log to a pipe the test closes, are made to log (SIGHUP),
/// and must still serve and report, then stop cleanly on SIGTERM.
#[test]
fn a_daemon_whose_log_reader_goes_away_keeps_running() -> anyhow::Result<()> {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "e2e.test")?;
    let mut coord = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "node-1")])),
            ..Default::default()
        },
    )?;
    // The same coordinator again, logging into a pipe of the test's.
    let code = coord
        .proc
        .take()
        .context("running")?
        .sigterm(Duration::from_secs(10))?;
    ensure!(code == Some(0), "first start stopped with {code:?}");
    let spawn_logging_to_pipe = |mut cmd: Command| -> anyhow::Result<std::process::Child> {
        let mut child = cmd
            .env("FLEETMEND_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // Read the first line, then close the read end.
        let mut first = String::new();
        BufReader::new(child.stderr.take().context("stderr")?).read_line(&mut first)?;
        ensure!(!first.is_empty(), "no log line before the pipe closed");
        Ok(child)
    };
    let mut c = command("coordinator");
    c.arg("--config").arg(&coord.config);
    let mut coordinator = spawn_logging_to_pipe(c)?;
    let served = wait_for("coordinator /healthz", SETTLE, || {
        if let Ok(Some(s)) = coordinator.try_wait() {
            return Ok(Err(s));
        }
        match testkit::procs::http_get(coord.http, "/healthz") {
            Ok((200, _)) => Ok(Ok(())),
            other => Err(format!("{other:?}")),
        }
    })?;
    if let Err(s) = served {
        bail!("the coordinator stopped ({s}) once its log reader went away");
    }

    let fixture = NodeFixture::builder("node-1")
        .nic("eth0")
        .address("10.0.0.1".parse()?)
        .build()?;
    let tls = pki.issue("node", "node-1", &[])?;
    let agent_cfg = AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
        .report_interval(Duration::from_millis(300));
    let cfg_path = fixture.write_agent_config(&agent_cfg)?;
    let mut a = command("node-agent");
    a.args(["run", "--config"]).arg(&cfg_path);
    let mut agent = spawn_logging_to_pipe(a)?;
    coord.wait_for_state("node-1", "healthy", SETTLE)?;

    // Both log on SIGHUP, into the closed pipe, twice for good measure.
    for _ in 0..2 {
        send_signal(coordinator.id(), "HUP")?;
        send_signal(agent.id(), "HUP")?;
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        coordinator.try_wait()?.is_none(),
        "the coordinator stopped when its log reader went away: {:?}",
        coordinator.try_wait()?
    );
    ensure!(
        agent.try_wait()?.is_none(),
        "the agent stopped when its log reader went away: {:?}",
        agent.try_wait()?
    );
    // Still serving and reporting.
    let seen = |m: &testkit::ctl_json::MachineSummary| m.last_report_at.map(testkit::ctl_json::ms);
    let before = coord.machines()?.first().and_then(seen);
    wait_for("node-1 to report again", SETTLE, || {
        match coord.machines().map(|ms| ms.first().and_then(seen)) {
            Ok(t) if t > before => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })?;
    assert_eq!(coord.machine("10.0.0.1")?.summary.state, "healthy");

    // And they stop as they should.
    for (name, child) in [("agent", &mut agent), ("coordinator", &mut coordinator)] {
        send_signal(child.id(), "TERM")?;
        let status = wait_for(&format!("{name} to stop"), SETTLE, || {
            match child.try_wait() {
                Ok(Some(s)) => Ok(s),
                other => Err(format!("{other:?}")),
            }
        })?;
        ensure!(status.success(), "{name} stopped with {status}");
    }
    Ok(())
}
