//! The packaged default configs (`packaging/*/*.toml`, installed as conffiles in
//! `/etc/fleetmend/`) load in the real binaries, and the certificate paths they name are the
//! ones each systemd unit waits for with `ConditionPathExists=`: if the two drifted apart, a
//! provisioned host would never start its service (or start it without its certificate).
//!
//! Building and checking the .deb files themselves is `packaging/build-debs.sh` and
//! `packaging/check-debs.sh` (docs/packaging.md); these tests only need the debug binaries.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use testkit::procs::{command, workspace_root};

fn read(rel: &str) -> Result<String> {
    let p = workspace_root().join(rel);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The paths a unit's `ConditionPathExists=` lines require.
fn unit_conditions(unit: &str) -> Result<Vec<String>> {
    Ok(read(&format!("systemd/{unit}"))?
        .lines()
        .filter_map(|l| l.strip_prefix("ConditionPathExists="))
        .map(str::to_string)
        .collect())
}

/// The value of `key = "…"` (first match) in a packaged TOML file, also on a line commented
/// out with `#` (the node-agent's TLS paths are suggestions until `coordinator` is set).
fn toml_string(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        let k = k.trim();
        (k.strip_prefix('#').unwrap_or(k) == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

fn assert_conditions_match(config: &str, unit: &str, cert_key: &str, key_key: &str) -> Result<()> {
    let text = read(config)?;
    let want: Vec<String> = [cert_key, key_key]
        .iter()
        .map(|k| toml_string(&text, k).with_context(|| format!("{config} sets no {k}")))
        .collect::<Result<_>>()?;
    let have = unit_conditions(unit)?;
    if have != want {
        bail!("{unit} waits for {have:?}, but {config} names {want:?}");
    }
    Ok(())
}

#[test]
fn packaged_coordinator_config_loads_and_matches_its_unit() -> Result<()> {
    let path = workspace_root().join("packaging/coordinator/coordinator.toml");
    let cfg = coordinator::config::Config::load(&path)?;
    // The store must sit in the unit's StateDirectory=, the only place it may write.
    let unit = read("systemd/coordinator.service")?;
    let state = unit
        .lines()
        .find_map(|l| l.strip_prefix("StateDirectory="))
        .context("coordinator.service has no StateDirectory=")?;
    let state_dir = PathBuf::from("/var/lib").join(state);
    assert!(
        cfg.database.starts_with(&state_dir),
        "database {} is outside the StateDirectory {}",
        cfg.database.display(),
        state_dir.display()
    );
    assert_eq!(
        unit_conditions("coordinator.service")?,
        [&cfg.tls.cert, &cfg.tls.key].map(|p| p.display().to_string()),
    );
    Ok(())
}

#[test]
fn packaged_node_agent_config_loads_and_matches_its_unit() -> Result<()> {
    let config = workspace_root().join("packaging/node-agent/node-agent.toml");
    // `check` loads the config (exit 64 when it is unusable) and runs the checks once against
    // this machine, which may well fail them (exit 1): only the config matters here.
    let out = command("node-agent")
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(64), "config refused: {stderr}");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{:?}: {stderr}",
        out.status
    );
    assert_conditions_match(
        "packaging/node-agent/node-agent.toml",
        "node-agent.service",
        "cert",
        "key",
    )
}

#[test]
fn packaged_gateway_config_loads_and_matches_its_unit() -> Result<()> {
    let config = workspace_root().join("packaging/bmc-gateway/bmc-gateway.toml");
    // No [[bmc]] tables in the default config: `check` loads it and has no BMC to read. Its
    // TLS files (/etc/fleetmend/tls/gateway.*) are normally not on a build host: then the
    // tls line is the one failure (exit 1), never a refused config (64).
    let out = command("bmc-gateway")
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            || (out.status.code() == Some(1)
                && stdout.lines().filter(|l| l.contains("FAIL")).count() == 1
                && stdout.contains("tls  FAIL  TLS files: ")),
        "{:?}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_conditions_match(
        "packaging/bmc-gateway/bmc-gateway.toml",
        "bmc-gateway.service",
        "cert",
        "key",
    )
}
