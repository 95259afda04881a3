//! Issue 11 item 5, the notifier half: `node-agent kdump-notify` as a real process against a
//! real coordinator process over mutual-TLS QUIC on loopback.
//! - "dumping" then "dump done" are recorded for the machine the certificate names, shown
//!   by `coordinatorctl machines show` (human and `--json`) and logged, and survive a
//!   coordinator restart (SQLite);
//! - a node certificate cannot report a dump for another machine, and an unregistered node
//!   is refused with the coordinator's reason (exit 69);
//! - "dumping" stops counting once the machine's agent reports again (a lost "dump done"
//!   must not hold a machine down for ever);
//! - the packaged wrapper (`packaging/kdump/fleetmend-kdump-notify`) sends both phases and
//!   exits 0 whatever happens, so it never stops a dump; the dracut module
//!   (`packaging/kdump/dracut/99fleetmend-kdump/module-setup.sh`), run by bash with stand-ins
//!   for dracut's helpers, installs node-agent, its settings and the TLS files they name;
//! - an unreachable coordinator ends the notifier with 69 once its `--timeout` passed; bad
//!   input (a missing flag, a config file) with 64, before any network use.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::Context;
use protocol::Role;
use protocol::messages::{HelloBody, KdumpNotice, KdumpPhase, RefusalCode};
use protocol::transport::{self, TlsFiles, TlsMaterial, TransportError};
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{
    CertFiles, Coordinator, CoordinatorOptions, Pki, command, free_udp_port, inventory_toml,
    start_agent, wait_for,
};

const ADDR: &str = "10.20.0.1";

fn start(dir: &Path) -> anyhow::Result<(Pki, Coordinator)> {
    let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
    let opts = CoordinatorOptions {
        inventory: Some(inventory_toml(&[(ADDR, "node-1"), ("10.20.0.2", "node-2")])),
        ..CoordinatorOptions::default()
    };
    let coord = Coordinator::start(&dir.join("coord"), &pki, &opts)?;
    Ok((pki, coord))
}

/// `node-agent kdump-notify --phase PHASE --coordinator ADDR --ca --cert --key …`.
fn notify(coordinator: &str, tls: &CertFiles, phase: &str, extra: &[&str]) -> Output {
    command("node-agent")
        .args([
            "kdump-notify",
            "--phase",
            phase,
            "--coordinator",
            coordinator,
        ])
        .arg("--ca")
        .arg(&tls.ca)
        .arg("--cert")
        .arg(&tls.cert)
        .arg("--key")
        .arg(&tls.key)
        .args(extra)
        .output()
        .expect("run node-agent kdump-notify")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn show(coord: &Coordinator) -> anyhow::Result<String> {
    let out = coord.ctl(&["machines", "show", ADDR])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn dumping_then_dump_done_are_recorded_shown_and_kept_across_a_restart() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (pki, mut coord) = start(tmp.path())?;
    let tls = Coordinator::agent_tls(&pki, "node-1")?;
    let server = coord.quic.to_string();

    let before = coord.machine(ADDR)?;
    assert_eq!(before.kdump, None, "no dump known yet");

    let out = notify(&server, &tls, "start", &["--boot-id", "crashed-boot-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let d = coord.machine(ADDR)?;
    let k = d.kdump.context("kdump shown after start")?;
    assert_eq!(k.phase, KdumpPhase::Start);
    assert!(k.dumping_now, "{k:?}");
    assert!(k.dumping_since.is_some() && k.done_at.is_none());
    assert_eq!(k.boot_id.as_deref(), Some("crashed-boot-1"));
    let human = show(&coord)?;
    assert!(
        human.contains("kdump:")
            && human.contains("dumping since")
            && human.contains("crashed-boot-1"),
        "{human}"
    );
    coord.wait_for_log(&["kdump", ADDR, "dumping since"], Duration::from_secs(10))?;

    let out = notify(&server, &tls, "done", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let k = coord
        .machine(ADDR)?
        .kdump
        .context("kdump shown after done")?;
    assert_eq!(k.phase, KdumpPhase::Done);
    assert!(!k.dumping_now);
    let (started, done) = (k.dumping_since.unwrap(), k.done_at.unwrap());
    assert!(done >= started, "{k:?}");
    assert!(show(&coord)?.contains("dump done at"));

    coord.restart()?;
    let after = coord
        .machine(ADDR)?
        .kdump
        .context("kdump kept across a restart")?;
    assert_eq!(after, k);
    let other = coord.machine("10.20.0.2")?;
    assert_eq!(
        other.kdump, None,
        "only the certificate's machine is marked"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_cannot_report_a_dump_for_another_machine() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let (pki, coord) = tokio::task::spawn_blocking(move || start(&dir)).await??;
    let tls = Coordinator::agent_tls(&pki, "node-2")?;
    let material = TlsMaterial::load(&TlsFiles {
        ca: tls.ca.clone(),
        cert: tls.cert.clone(),
        key: tls.key.clone(),
    })?;
    let endpoint = material.client_endpoint(coord.quic)?;
    let forged = KdumpNotice {
        hostname: "node-1".into(),
        phase: KdumpPhase::Start,
        boot_id: None,
        time_unix_ms: 0,
    };
    let r = transport::connect(
        &endpoint,
        coord.quic,
        "127.0.0.1",
        Role::Coordinator,
        HelloBody::Kdump(forged),
    )
    .await;
    match r {
        Err(TransportError::Refused(r)) => {
            assert_eq!(r.code, RefusalCode::IdentityMismatch, "{r}");
            assert!(r.reason.contains("node-2"), "{r}");
        }
        other => panic!("a forged kdump notice was not refused: {other:?}"),
    }
    let coord = std::sync::Arc::new(coord);
    let c = coord.clone();
    let d = tokio::task::spawn_blocking(move || c.machine(ADDR)).await??;
    assert_eq!(d.kdump, None, "nothing recorded for node-1");

    // An unregistered node: refused with the coordinator's reason, not retried.
    let stranger = Coordinator::agent_tls(&pki, "node-x")?;
    let server = coord.quic.to_string();
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        notify(&server, &stranger, "start", &["--timeout", "30s"])
    })
    .await?;
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no machine with hostname node-x"),
        "{}",
        stderr(&out)
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "a refusal is final: {:?}",
        t.elapsed()
    );
    Ok(())
}

#[test]
fn an_unreachable_coordinator_exits_69_after_the_timeout_and_bad_input_64() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "e2e.test")?;
    let tls = Coordinator::agent_tls(&pki, "node-1")?;
    let nobody = format!("127.0.0.1:{}", free_udp_port());
    let t = Instant::now();
    let out = notify(&nobody, &tls, "start", &["--timeout", "3s"]);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not reached within 3s"),
        "{}",
        stderr(&out)
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "retried until about the timeout: {took:?}"
    );

    let out = command("node-agent")
        .args(["kdump-notify", "--phase", "start", "--coordinator", &nobody])
        .output()?;
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--ca is required"),
        "{}",
        stderr(&out)
    );
    let out = notify(&nobody, &tls, "dumping", &[]);
    assert_eq!(out.status.code(), Some(64), "an unknown phase is bad input");
    assert!(stderr(&out).contains("start or done"), "{}", stderr(&out));
    let out = notify(
        &nobody,
        &tls,
        "start",
        &["--config", "/etc/fleetmend/node-agent.toml"],
    );
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("no config file"), "{}", stderr(&out));
    Ok(())
}

/// `packaging/kdump/fleetmend-kdump-notify PHASE` with the settings file `env`.
fn wrapper(env: &Path, args: &[&str]) -> Output {
    let script = testkit::procs::workspace_root().join("packaging/kdump/fleetmend-kdump-notify");
    let mut cmd = std::process::Command::new("sh");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FLEETMEND_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg(script)
        .args(args)
        .env("FLEETMEND_KDUMP_ENV", env)
        .env("FLEETMEND_NODE_AGENT", testkit::procs::bin("node-agent"))
        .output()
        .expect("run the kdump wrapper")
}

#[test]
fn the_packaged_wrapper_sends_both_phases_and_never_fails_the_dump() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (pki, coord) = start(tmp.path())?;
    let tls = Coordinator::agent_tls(&pki, "node-1")?;
    let env_file = |coordinator: &str, timeout: &str| -> anyhow::Result<std::path::PathBuf> {
        let p = tmp.path().join(format!("kdump-notify-{timeout}.env"));
        std::fs::write(
            &p,
            format!(
                "FLEETMEND_AGENT_COORDINATOR={coordinator}\nFLEETMEND_AGENT_CA={}\n\
                 FLEETMEND_AGENT_CERT={}\nFLEETMEND_AGENT_KEY={}\nFLEETMEND_KDUMP_TIMEOUT={timeout}\n",
                tls.ca.display(),
                tls.cert.display(),
                tls.key.display()
            ),
        )?;
        Ok(p)
    };
    let env = env_file(&coord.quic.to_string(), "30s")?;
    let out = wrapper(&env, &["start"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("coordinator told: start"),
        "{}",
        stderr(&out)
    );
    assert!(coord.machine(ADDR)?.kdump.is_some_and(|k| k.dumping_now));
    // As kexec-tools' kdump_post calls it: the dump's exit status after the phase.
    let out = wrapper(&env, &["done", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let k = coord.machine(ADDR)?.kdump.context("kdump shown")?;
    assert_eq!((k.phase, k.dumping_now), (KdumpPhase::Done, false));

    // Nobody listening, a missing settings file, a wrong phase: logged, exit 0 all the same.
    let nobody = env_file(&format!("127.0.0.1:{}", free_udp_port()), "1s")?;
    let out = wrapper(&nobody, &["start"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unreachable or refusing (exit 69)"),
        "{}",
        stderr(&out)
    );
    let out = wrapper(&tmp.path().join("missing.env"), &["start"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("missing; nothing sent"),
        "{}",
        stderr(&out)
    );
    let out = wrapper(&env, &["0"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("unknown phase"), "{}", stderr(&out));
    Ok(())
}

/// The settings file is sourced by `sh`: an unclosed quote or an `exit` in it used to end the
/// wrapper with that status (2, 3), and kexec-tools skips the dump when `kdump_pre` fails.
#[test]
fn a_settings_file_the_shell_cannot_read_never_fails_the_dump() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    for (name, body) in [
        (
            "quote.env",
            "FLEETMEND_AGENT_COORDINATOR=\"127.0.0.1:7443\n",
        ),
        ("exits.env", "exit 3\n"),
    ] {
        let env = tmp.path().join(name);
        std::fs::write(&env, body)?;
        let out = wrapper(&env, &["start"]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("does not read as settings") && stderr(&out).contains(name),
            "{name}: {}",
            stderr(&out)
        );
    }
    Ok(())
}

#[test]
fn a_dumping_machine_whose_agent_reports_again_is_no_longer_held_down() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (pki, coord) = start(tmp.path())?;
    let tls = Coordinator::agent_tls(&pki, "node-1")?;
    let out = notify(&coord.quic.to_string(), &tls, "start", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(coord.machine(ADDR)?.kdump.is_some_and(|k| k.dumping_now));

    // The "dump done" was lost; the machine rebooted and its agent reports again.
    let fixture = NodeFixture::builder("node-1")
        .address(ADDR.parse()?)
        .build()?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
            .report_interval(Duration::from_millis(300)),
    )?;
    let _agent = start_agent("node-1", &cfg, &tmp.path().join("node-1.log"))?;
    let k = wait_for("the dump to stop counting", Duration::from_secs(30), || {
        let k = coord
            .machine(ADDR)
            .map_err(|e| e.to_string())?
            .kdump
            .ok_or("kdump record lost")?;
        if k.dumping_now {
            Err(format!("{k:?}"))
        } else {
            Ok(k)
        }
    })?;
    assert_eq!(k.phase, KdumpPhase::Start, "the record itself is kept");
    assert!(
        show(&coord)?.contains("but the agent has reported since"),
        "{}",
        show(&coord)?
    );
    Ok(())
}

/// Runs `script` in bash after sourcing the dracut module with stand-ins for dracut's
/// helpers that print what they were asked to install.
fn dracut_module(env: &Path, initdir: &Path, script: &str) -> Output {
    let module = testkit::procs::workspace_root()
        .join("packaging/kdump/dracut/99fleetmend-kdump/module-setup.sh");
    let stubs = r#"
require_binaries() { echo "require_binaries $*"; return 0; }
inst_binary() { echo "inst_binary $*"; }
inst_simple() { echo "inst_simple $*"; }
inst_script() { echo "inst_script $*"; }
derror() { echo "derror $*" >&2; }
dfatal() { echo "dfatal $*" >&2; }
"#;
    std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -u\n{stubs}\n. {:?}\n{script}", module))
        .env("FLEETMEND_KDUMP_ENV", env)
        .env("initdir", initdir)
        .output()
        .expect("run bash")
}

#[test]
fn the_dracut_module_installs_the_notifier_its_settings_and_the_tls_files_they_name()
-> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let initdir = tmp.path().join("initramfs");
    std::fs::create_dir_all(&initdir)?;
    let tls_dir = tmp.path().join("tls");
    std::fs::create_dir_all(&tls_dir)?;
    for f in ["ca.crt", "node.crt", "node.key"] {
        std::fs::write(tls_dir.join(f), "pem")?;
    }
    let env = tmp.path().join("kdump-notify.env");
    std::fs::write(
        &env,
        format!(
            "FLEETMEND_AGENT_COORDINATOR=10.0.0.10:7443\nFLEETMEND_AGENT_CA={0}/ca.crt\n\
             FLEETMEND_AGENT_CERT={0}/node.crt\nFLEETMEND_AGENT_KEY={0}/node.key\n",
            tls_dir.display()
        ),
    )?;

    // Included only when asked for (255), and only with its settings file.
    let out = dracut_module(&env, &initdir, "check; echo rc=$?");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=255"),
        "{out:?}"
    );
    let out = dracut_module(&tmp.path().join("none.env"), &initdir, "check; echo rc=$?");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=1"),
        "{out:?}"
    );
    assert!(stderr(&out).contains("is missing"), "{out:?}");
    let out = dracut_module(&env, &initdir, "depends");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "network");

    let out = dracut_module(&env, &initdir, "install; echo rc=$?");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in [
        "inst_binary /usr/bin/node-agent".to_string(),
        format!("inst_simple {}", env.display()),
        format!("inst_simple {}/ca.crt", tls_dir.display()),
        format!("inst_simple {}/node.crt", tls_dir.display()),
        format!("inst_simple {}/node.key", tls_dir.display()),
        "inst_script /usr/lib/fleetmend/kdump/fleetmend-kdump-notify".to_string(),
        "inst_script /usr/lib/fleetmend/kdump/fleetmend-kdump-start".to_string(),
        "inst_script /usr/lib/fleetmend/kdump/fleetmend-kdump-done".to_string(),
        "rc=0".to_string(),
    ] {
        assert!(
            stdout.contains(&want),
            "missing {want:?} in:\n{stdout}\n{}",
            stderr(&out)
        );
    }
    let cmdline = std::fs::read_to_string(initdir.join("etc/cmdline.d/90fleetmend-kdump.conf"))?;
    assert_eq!(cmdline.trim(), "rd.neednet=1");

    // A TLS file the settings name but that is not there stops the build, loudly.
    std::fs::remove_file(tls_dir.join("node.key"))?;
    let out = dracut_module(&env, &initdir, "install; echo rc=$?");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=1"),
        "{out:?}"
    );
    assert!(stderr(&out).contains("node.key"), "{out:?}");
    Ok(())
}
