//! Prometheus artefacts checked with the real `promtool` (Debian's `prometheus` package,
//! installed by `scripts/setup-test-deps.sh`): the alerting rules in `packaging/prometheus/`
//! parse and pass their unit tests, and live `/metrics` scrapes of a running coordinator and
//! bmc-gateway pass `promtool check metrics` and carry the standard `process_*` series.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use protocol::Role;
use protocol::gateway::{PowerAction, PowerRequest};
use testkit::bmc_sim::{GatewayClient, GatewayProc, IpmiSim, TestPki};
use testkit::fixture::{AgentConfig, FakeKubelet, NodeFixture};
use testkit::procs::{
    Coordinator, CoordinatorOptions, Pki, command, inventory_toml, metric, run_ok, start_agent,
    wait_for, workspace_root,
};

fn promtool() -> Result<PathBuf> {
    for p in ["/usr/bin/promtool", "/usr/local/bin/promtool"] {
        let p = PathBuf::from(p);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!(
        "promtool not found: run scripts/setup-test-deps.sh (it installs Debian's prometheus package)"
    )
}

fn rules_dir() -> PathBuf {
    workspace_root().join("packaging/prometheus")
}

/// Runs promtool with `args` in the rules directory, feeding `stdin`; returns its output,
/// failing with it when promtool does.
fn run_promtool(args: &[&str], stdin: &str) -> Result<String> {
    let mut child = Command::new(promtool()?)
        .args(args)
        .current_dir(rules_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "promtool {args:?} failed:\n{text}");
    Ok(text)
}

/// `promtool check metrics` reads a scrape on stdin; it exits non-zero on lint problems
/// (a counter without `_total`, a missing HELP, a malformed line).
fn lint(scrape: &str) -> Result<()> {
    run_promtool(&["check", "metrics"], scrape).map(|_| ())
}

#[test]
fn alerting_rules_pass_promtool_check_and_their_unit_tests() -> Result<()> {
    let out = run_promtool(&["check", "rules", "fleetmend-rules.yml"], "")?;
    assert!(out.contains("SUCCESS"), "{out}");
    let out = run_promtool(&["test", "rules", "fleetmend-rules.test.yml"], "")?;
    assert!(out.contains("SUCCESS"), "{out}");
    // The dashboard is valid JSON and every panel queries something.
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        rules_dir().join("fleetmend-dashboard.json"),
    )?)?;
    let panels = dash["panels"].as_array().context("panels")?;
    ensure!(panels.len() >= 10, "{} panels", panels.len());
    for p in panels {
        ensure!(
            p["targets"][0]["expr"]
                .as_str()
                .is_some_and(|e| !e.is_empty()),
            "panel without a query: {p}"
        );
    }
    Ok(())
}

#[test]
fn the_metrics_lint_fails_on_a_broken_scrape() -> Result<()> {
    // The lint is only worth something if it can fail: a counter not named `_total`.
    let bad =
        "# HELP fleetmend_things Things.\n# TYPE fleetmend_things counter\nfleetmend_things 1\n";
    let err = lint(bad).expect_err("promtool accepted a counter without _total");
    assert!(err.to_string().contains("_total"), "{err}");
    Ok(())
}

#[test]
fn a_live_coordinator_scrape_passes_promtool_and_has_process_metrics() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let repair = tmp.path().join("cluster.yml");
    std::fs::write(
        &repair,
        "repair:\n  repair_procedures:\n    - machine_types: [qemu]\n      repair_operations:\n        - operation: unhealthy\n          repair_steps:\n            - repair_command: [\"true\"]\n          health_check_command: [\"true\"]\n",
    )?;
    let coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "n1"), ("10.0.0.2", "n2")])),
            // Remediation, the repair queue and a gateway (nothing listens at its address)
            // on, so their series are part of the scrape.
            extra: format!(
                "[repair]\nconfig = {:?}\n\n[remediation]\ninterval = \"500ms\"\n\n\
                 [[gateways.targets]]\nname = \"rack-1\"\naddress = \"127.0.0.1:{}\"\n\
                 server_name = \"127.0.0.1\"\nracks = [\"rack-1\"]\n",
                repair.display().to_string(),
                testkit::procs::free_udp_port()
            ),
            ..Default::default()
        },
    )?;
    // Let one remediation pass run, and the coordinator look at the gateway once.
    std::thread::sleep(Duration::from_millis(1500));
    let scrape = testkit::procs::wait_for(
        "the coordinator's look at the gateway in /metrics",
        Duration::from_secs(20),
        || {
            let (status, scrape) = coord.http_get("/metrics").map_err(|e| e.to_string())?;
            if status == 200 && scrape.contains("fleetmend_power_gateway_reachable{") {
                Ok(scrape)
            } else {
                Err(format!("/metrics answered {status}"))
            }
        },
    )?;
    for series in [
        "fleetmend_machines{",
        "fleetmend_store_failing ",
        "fleetmend_remediation_passes_total ",
        "fleetmend_report_handling_seconds_bucket{le=\"+Inf\"} ",
        "fleetmend_agent_rtt_seconds_count ",
        "fleetmend_fence_flows_running{state=\"power-off\"} ",
        // The coordinator's own look at the gateway: nothing answers there.
        "fleetmend_power_gateway_reachable{gateway=\"rack-1\"} 0",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "process_open_fds ",
        "process_start_time_seconds ",
    ] {
        ensure!(scrape.contains(series), "no {series} in:\n{scrape}");
    }
    lint(&scrape)?;
    // Every coordinator series an alert or a dashboard panel reads is served.
    served_by(&scrape, |name| !name.starts_with("fleetmend_gateway_"))
}

#[test]
fn an_agent_certificate_about_to_expire_is_said_by_both_sides_and_counted() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "fleet.test")?;
    let coord = Coordinator::start(
        &tmp.path().join("coordinator"),
        &pki,
        &CoordinatorOptions {
            inventory: Some(inventory_toml(&[("10.0.0.1", "n1"), ("10.0.0.2", "n2")])),
            ..Default::default()
        },
    )?;
    let scrape = coord.scrape()?;
    expires_in_days(
        &scrape,
        "fleetmend_certificate_expiry_timestamp_seconds{certificate=\"coordinator\"}",
        365.0,
    )?;
    ensure!(metric(&scrape, "fleetmend_agent_certificates_known") == Some(0.0));
    ensure!(
        metric(
            &scrape,
            "fleetmend_agent_certificate_expiry_earliest_timestamp_seconds"
        )
        .is_none(),
        "no agent yet, no earliest expiry"
    );

    // n1 gets a certificate of ten days, n2 one of the default year.
    let issue = |role: &str, name: &str, days: &str| {
        run_ok(command("coordinatorctl").args([
            "pki",
            "issue",
            "--ca",
            &pki.ca_dir.to_string_lossy(),
            "--role",
            role,
            "--name",
            name,
            "--days",
            days,
            "--force",
            "--out",
            &pki.certs_dir.to_string_lossy(),
        ]))
    };
    issue("node", "n1", "10")?;
    issue("node", "n2", "365")?;
    let kubelet = FakeKubelet::start()?;
    let mut agents = Vec::new();
    for (name, address) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2")] {
        let fixture = NodeFixture::builder(name)
            .address(address.parse()?)
            .build()?;
        let cfg = fixture.write_agent_config(
            &AgentConfig::new(
                &coord.quic.to_string(),
                pki.ca_cert(),
                pki.certs_dir.join(format!("{name}.crt")),
                pki.certs_dir.join(format!("{name}.key")),
            )
            .report_interval(Duration::from_millis(300))
            .kubelet_url(&kubelet.url()),
        )?;
        let log = tmp.path().join(format!("{name}.log"));
        agents.push((start_agent(name, &cfg, &log)?, fixture));
    }
    agents[0].0.wait_for_log(
        &[
            "the certificate expires in ",
            " days (",
            "--role node --name n1",
        ],
        Duration::from_secs(20),
    )?;
    coord.wait_for_log(
        &["the agent's certificate expires in ", "--name n1"],
        Duration::from_secs(20),
    )?;
    let scrape = wait_for("both agents' certificates", Duration::from_secs(20), || {
        let s = coord.scrape().map_err(|e| e.to_string())?;
        match metric(&s, "fleetmend_agent_certificates_known") {
            Some(2.0) => Ok(s),
            other => Err(format!("fleetmend_agent_certificates_known {other:?}")),
        }
    })?;
    ensure!(
        metric(&scrape, "fleetmend_agent_certificates_expiring") == Some(1.0),
        "only n1's expires within 30 days:\n{scrape}"
    );
    expires_in_days(
        &scrape,
        "fleetmend_agent_certificate_expiry_earliest_timestamp_seconds",
        10.0,
    )?;
    ensure!(
        !agents[1].0.log_text().contains("expires in"),
        "n2's certificate is good for a year: {}",
        agents[1].0.log_text()
    );
    lint(&scrape)?;

    // Renewed and reloaded, n1 reconnects with its new certificate, and the count clears
    // (a connection keeps the certificate of its handshake for as long as it lasts).
    issue("node", "n1", "365")?;
    let pid = agents[0].0.pid().context("n1's pid")?;

    // coordinatorctl says so too, on stderr, and goes on.
    issue("admin", "short", "5")?;
    let out = run_ok(
        command("coordinatorctl")
            .arg("--server")
            .arg(coord.quic.to_string())
            .arg("--ca")
            .arg(pki.ca_cert())
            .arg("--cert")
            .arg(pki.certs_dir.join("short.crt"))
            .arg("--key")
            .arg(pki.certs_dir.join("short.key"))
            .args(["machines", "list", "--json"]),
    )?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        err.contains("coordinatorctl: the certificate expires in ")
            && err.contains("--role admin --name short`"),
        "{err}"
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).context("stdout stays JSON")?;
    run_ok(Command::new("kill").args(["-HUP", &pid.to_string()]))?;
    agents[0].0.wait_for_log(
        &["configuration and TLS files reloaded"],
        Duration::from_secs(20),
    )?;
    wait_for("n1's renewed certificate", Duration::from_secs(20), || {
        let s = coord.scrape().map_err(|e| e.to_string())?;
        match metric(&s, "fleetmend_agent_certificates_expiring") {
            Some(0.0) => Ok(()),
            other => Err(format!("fleetmend_agent_certificates_expiring {other:?}")),
        }
    })?;
    Ok(())
}

/// Fails unless `series` in `scrape` is a time about `days` from now (within an hour).
fn expires_in_days(scrape: &str, series: &str, days: f64) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let at = metric(scrape, series).with_context(|| format!("no {series}"))?;
    ensure!(
        (at - (now + days * 86_400.0)).abs() < 3600.0,
        "{series} is {at}, not {days} days from {now}"
    );
    Ok(())
}

/// The `fleetmend_*` names the alerting rules and the dashboard query.
fn queried_series() -> Result<std::collections::BTreeSet<String>> {
    let mut names = std::collections::BTreeSet::new();
    for file in ["fleetmend-rules.yml", "fleetmend-dashboard.json"] {
        let text = std::fs::read_to_string(rules_dir().join(file))?;
        for (i, _) in text.match_indices("fleetmend_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // Job names (`fleetmend-coordinator`) use a hyphen, so every hit is a series.
            names.insert(name);
        }
    }
    ensure!(names.len() >= 10, "only {names:?}");
    Ok(names)
}

/// Fails unless each queried series that `mine` selects is in `scrape`: with a sample, or
/// declared by its `# TYPE` line (a counter with labels has samples only once something
/// happened, such as a remediation decision).
fn served_by(scrape: &str, mine: impl Fn(&str) -> bool) -> Result<()> {
    let mut served: std::collections::BTreeSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    served.extend(
        scrape
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()),
    );
    let missing: Vec<String> = queried_series()?
        .into_iter()
        .filter(|n| mine(n) && !served.contains(n.as_str()))
        .collect();
    ensure!(
        missing.is_empty(),
        "queried by packaging/prometheus/ but not served: {missing:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_gateway_scrape_passes_promtool_and_has_process_metrics() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let pw_file = pki.dir.path().join("bmc.pw");
    std::fs::write(&pw_file, format!("{}\n", sim.password))?;
    let cfg = format!(
        "[[bmc]]\nmachine = \"10.0.0.1\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = \"{}\"\n",
        sim.port,
        sim.username,
        pw_file.display()
    );
    let gw = GatewayProc::start(&pki, &cfg).await?;
    // One action, so the histogram and the reachability gauge have samples.
    let tls = pki.material(Role::Coordinator, "coord-1")?;
    let c = GatewayClient::connect(&tls, gw.quic, GatewayClient::coordinator_hello()).await?;
    let req = PowerRequest {
        id: "status-1".into(),
        address: "10.0.0.1".into(),
        serial: String::new(),
        action: PowerAction::Status,
        timeout_ms: 20_000,
    };
    c.request(req, Duration::from_secs(30)).await?;
    let scrape = gw.metrics().await?;
    for series in [
        "fleetmend_gateway_action_duration_seconds_bucket{",
        "fleetmend_gateway_bmc_reachable{",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
    ] {
        ensure!(scrape.contains(series), "no {series} in:\n{scrape}");
    }
    lint(&scrape)?;
    served_by(&scrape, |name| name.starts_with("fleetmend_gateway_"))
}
