//! The `node-agent` binary as an operator runs it: `check` output and exit status, and the
//! exit code 64 for bad configuration.

#[allow(unreachable_pub, dead_code, missing_docs, unused_imports)]
#[path = "../../tests/src/fixture.rs"]
mod fixture;

use std::process::{Command, Output};
use std::time::Duration;

use fixture::{AgentConfig, FakeKubelet, NodeFixture};

const BIN: &str = env!("CARGO_BIN_EXE_node-agent");

/// Runs the binary with a deadline so a hang fails the test instead of blocking it.
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .env("FLEETMEND_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn node-agent");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("node-agent {args:?} did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn node(kubelet: &FakeKubelet) -> (NodeFixture, String) {
    let fx = NodeFixture::builder("cli-node")
        .nic("eth0")
        .mount("/var")
        .build()
        .unwrap();
    // `check` refuses (exit 64) what `run` would refuse, TLS files included, so the node gets
    // a real certificate of a real CA (the coordinator it names is never reached).
    let pki = fx.root().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let ca = protocol::pki::Ca::generate("cli.test").unwrap();
    let ca_file = pki.join("ca.crt");
    protocol::pki::write_file(&ca_file, ca.cert_pem(), 0o644, false).unwrap();
    let (cert, key) = ca
        .issue(
            protocol::Role::Node,
            "cli-node",
            &protocol::pki::IssueOptions::loopback(),
        )
        .unwrap()
        .write(&pki, false)
        .unwrap();
    let cfg = fx
        .write_agent_config(
            &AgentConfig::new("127.0.0.1:1", &ca_file, &cert, &key).kubelet_url(&kubelet.url()),
        )
        .unwrap();
    (fx, cfg.to_string_lossy().into_owned())
}

#[test]
fn check_json_on_a_healthy_node_exits_zero() {
    let k = FakeKubelet::start().unwrap();
    let (_fx, cfg) = node(&k);
    let out = run(&["check", "--config", &cfg, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["hostname"], "cli-node");
    assert_eq!(v["healthy"], true);
    let kinds: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["kubelet", "nic", "disk", "kdump"]);
}

#[test]
fn check_table_shows_failures_and_exits_one() {
    let k = FakeKubelet::start().unwrap();
    let (fx, cfg) = node(&k);
    fx.set_carrier("eth0", false).unwrap();
    k.set_healthy(false);
    let out = run(&["check", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("KIND"), "{table}");
    let nic = table.lines().find(|l| l.starts_with("nic")).unwrap();
    assert!(nic.contains("eth0") && nic.contains("fail"), "{table}");
    let kubelet = table.lines().find(|l| l.starts_with("kubelet")).unwrap();
    assert!(
        kubelet.contains("fail") && kubelet.contains("500"),
        "{table}"
    );
}

#[test]
fn flags_override_the_file() {
    let k = FakeKubelet::start().unwrap();
    let (_fx, cfg) = node(&k);
    // --nic replaces the file's list: eth9 does not exist.
    let out = run(&["check", "--config", &cfg, "--json", "--nic", "eth9"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["checks"][1]["subject"], "eth9");
}

#[test]
fn bad_configuration_exits_64_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "coordinator = \"c:1\"\nrepot_interval = \"5s\"\n").unwrap();
    let p = path.to_string_lossy();
    let out = run(&["run", "--config", &p]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("repot_interval") && err.contains("bad.toml"),
        "{err}"
    );

    let out = run(&["check", "--config", "/nonexistent/node-agent.toml"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");

    // `run` without a coordinator.
    std::fs::write(&path, "report_interval = \"1s\"\n").unwrap();
    let out = run(&["run", "--config", &p]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("coordinator"));
}

#[test]
fn unreadable_tls_files_exit_one_so_systemd_retries() {
    let k = FakeKubelet::start().unwrap();
    let (fx, _) = node(&k);
    let cfg = fx
        .write_agent_config(
            &AgentConfig::new("127.0.0.1:1", "/nonexistent/ca.crt", "/x.crt", "/x.key")
                .kubelet_url(&k.url()),
        )
        .unwrap();
    let out = run(&["run", "--config", &cfg.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ca.crt"),
        "{out:?}"
    );
}
