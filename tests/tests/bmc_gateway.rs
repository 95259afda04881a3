//! End-to-end tests of the bmc-gateway binary against real BMC simulators: `ipmi_sim`
//! (OpenIPMI, read back with `ipmitool`) and `sushy-emulator` (Redfish), commanded over
//! mutual-TLS QUIC as a coordinator would.
//!
//! Missing simulators fail the tests with a message to run `scripts/setup-test-deps.sh`.
//! The benchmark at the bottom is `#[ignore]`d and run by name (see docs/benchmarks.md).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use protocol::Role;
use protocol::gateway::{PowerAction, PowerOutcome, PowerRequest, PowerState};
use protocol::messages::{AdminHello, AgentHello, HelloBody, RefusalCode};
use protocol::transport::TransportError;
use testkit::bmc_sim::{
    FakeSystem, GatewayClient, GatewayOptions, GatewayProc, IpmiSim, Sushy, TestPki, wait_until,
};
use testkit::procs::free_udp_port;

/// Generous bound for one gateway answer on loopback (IPMI session set-up included).
const ANSWER: Duration = Duration::from_secs(20);
/// sushy-emulator applies a power change up to ~11 s after it was asked; 45 s leaves margin
/// for a loaded machine (25 s was seen to fail with builds running on both cores).
const SUSHY_APPLY: Duration = Duration::from_secs(45);

fn req(id: &str, machine: &str, action: PowerAction) -> PowerRequest {
    PowerRequest {
        id: id.into(),
        address: machine.into(),
        serial: String::new(),
        action,
        timeout_ms: 0,
    }
}

fn ipmi_bmc(dir: &std::path::Path, machine: &str, port: u16, user: &str, pw: &str) -> String {
    let pw_file = dir.join(format!("{machine}.pw"));
    std::fs::write(&pw_file, format!("{pw}\n")).unwrap();
    format!(
        "[[bmc]]\nmachine = \"{machine}\"\nserial = \"SN-{machine}\"\nprotocol = \"ipmi\"\nhost = \"127.0.0.1\"\nport = {port}\nusername = \"{user}\"\npassword_file = \"{}\"\n[bmc.ipmi]\nreply_timeout = \"500ms\"\nattempts = 3\n\n",
        pw_file.display()
    )
}

fn redfish_bmc(dir: &std::path::Path, machine: &str, s: &Sushy, system: &str, pw: &str) -> String {
    let pw_file = dir.join(format!("{machine}.pw"));
    std::fs::write(&pw_file, format!("{pw}\n")).unwrap();
    format!(
        "[[bmc]]\nmachine = \"{machine}\"\nprotocol = \"redfish\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{}\"\npassword_file = \"{}\"\n[bmc.redfish]\nsystem = \"{system}\"\nca_file = \"{}\"\n\n",
        s.port,
        s.username,
        pw_file.display(),
        s.ca_file.display()
    )
}

fn done(o: &PowerOutcome) -> Result<(PowerState, String)> {
    match o {
        PowerOutcome::Done { state, detail, .. } => Ok((*state, detail.clone())),
        PowerOutcome::Failed { detail, .. } => {
            anyhow::bail!("expected success, got failure: {detail}")
        }
    }
}

fn failed(o: &PowerOutcome) -> Result<(String, bool)> {
    match o {
        PowerOutcome::Failed { detail, retriable } => Ok((detail.clone(), *retriable)),
        PowerOutcome::Done { detail, .. } => {
            anyhow::bail!("expected failure, got success: {detail}")
        }
    }
}

async fn coordinator(pki: &TestPki, gw: &GatewayProc) -> Result<GatewayClient> {
    let tls = pki.material(Role::Coordinator, "coord-1")?;
    Ok(GatewayClient::connect(&tls, gw.quic, GatewayClient::coordinator_hello()).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_every_action_confirmed_by_ipmitool() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let cfg = ipmi_bmc(
        pki.dir.path(),
        "10.0.0.1",
        sim.port,
        &sim.username,
        &sim.password,
    );
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;
    let m = "10.0.0.1";

    let r = c.request(req("s1", m, PowerAction::Status), ANSWER).await?;
    assert_eq!(done(&r.outcome)?.0, PowerState::On);
    assert!(sim.power_is_on().await?);

    let r = c.request(req("off1", m, PowerAction::Off), ANSWER).await?;
    done(&r.outcome)?;
    assert!(
        !sim.power_is_on().await?,
        "ipmitool still reads on after off"
    );
    assert_eq!(sim.events().last().map(String::as_str), Some("set power 0"));
    let r = c.request(req("s2", m, PowerAction::Status), ANSWER).await?;
    assert_eq!(done(&r.outcome)?.0, PowerState::Off);

    // Cycle on an off machine powers it on.
    let r = c
        .request(req("cyc-off", m, PowerAction::Cycle), ANSWER)
        .await?;
    let (_, detail) = done(&r.outcome)?;
    assert!(detail.contains("was off"), "{detail}");
    assert!(
        sim.power_is_on().await?,
        "cycle did not power on an off machine"
    );
    assert_eq!(sim.events().last().map(String::as_str), Some("set power 1"));

    // Cycle on a running machine: the simulator sees power 0 then (after its own delay) 1.
    let before = sim.events().len();
    let r = c
        .request(req("cyc-on", m, PowerAction::Cycle), ANSWER)
        .await?;
    done(&r.outcome)?;
    wait_until(
        "cycle completes in ipmi_sim",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let ev = sim.events();
            Ok(ev[before..].iter().any(|e| e == "set power 0")
                && ev.last().map(String::as_str) == Some("set power 1"))
        },
    )
    .await?;
    assert!(sim.power_is_on().await?);

    let before = sim.events().len();
    let r = c.request(req("rst", m, PowerAction::Reset), ANSWER).await?;
    done(&r.outcome)?;
    assert_eq!(sim.events()[before..], ["set reset 1".to_string()]);
    assert!(sim.power_is_on().await?);

    let r = c
        .request(req("soft", m, PowerAction::SoftOff), ANSWER)
        .await?;
    done(&r.outcome)?;
    assert_eq!(
        sim.events().last().map(String::as_str),
        Some("set shutdown 1")
    );
    assert!(!sim.power_is_on().await?);

    let r = c.request(req("on1", m, PowerAction::On), ANSWER).await?;
    done(&r.outcome)?;
    assert!(sim.power_is_on().await?);

    let r = c
        .request(req("fence-1", m, PowerAction::Fence), ANSWER)
        .await?;
    let PowerOutcome::Done {
        state,
        confirmed_off_unix_ms,
        detail,
    } = &r.outcome
    else {
        anyhow::bail!("fence failed: {:?}", r.outcome);
    };
    assert_eq!(*state, PowerState::Off);
    assert!(confirmed_off_unix_ms.is_some());
    assert!(detail.starts_with("fenced, confirmed off at "), "{detail}");
    assert!(!sim.power_is_on().await?);

    // A repeated id answers with the first result and does not act again: power the machine
    // on, repeat the fence id, and the machine stays on.
    let r2 = c.request(req("on2", m, PowerAction::On), ANSWER).await?;
    done(&r2.outcome)?;
    let events = sim.events().len();
    let again = c
        .request(req("fence-1", m, PowerAction::Fence), ANSWER)
        .await?;
    assert_eq!(again, r, "a repeated id must return the first result");
    assert_eq!(sim.events().len(), events, "a repeated id acted again");
    assert!(
        sim.power_is_on().await?,
        "a repeated fence id powered the machine off"
    );

    // Every action above shared one RMCP+ session, but for the cycle and the reset: each is
    // sent once only (a resend would run it twice), so each gets a fresh session that cannot
    // have expired under it.
    let opened = gw.log().matches("IPMI session opened").count();
    assert_eq!(opened, 3, "sessions opened: {opened}\n{}", gw.log());
    // Only the first is said at INFO: the idle probe replaces a session every minute, and an
    // INFO line per BMC per minute forever would bury everything else in the log.
    let log = gw.log();
    let said = log
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("IPMI session opened"))
        .count();
    assert_eq!(said, 1, "sessions opened at INFO: {said}\n{log}");

    let metrics = gw.metrics().await?;
    assert!(
        metrics.contains("fleetmend_gateway_action_duration_seconds_count{protocol=\"ipmi\",action=\"fence\",result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("fleetmend_gateway_bmc_reachable{machine=\"10.0.0.1\",protocol=\"ipmi\"} 1")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_every_action_confirmed_by_sushy() -> Result<()> {
    let pki = TestPki::new()?;
    let systems = [
        FakeSystem::new(1, "status", true),
        FakeSystem::new(2, "off", true),
        FakeSystem::new(3, "on", false),
        FakeSystem::new(4, "soft", true),
        FakeSystem::new(5, "cycle", true),
        FakeSystem::new(6, "cycle-off", false),
        FakeSystem::new(7, "reset", true),
        FakeSystem::new(8, "fence", true),
    ];
    let only = [FakeSystem::new(9, "only", true)];
    let (sushy, single) = tokio::try_join!(
        Sushy::start(&pki.ca, &systems),
        Sushy::start(&pki.ca, &only)
    )?;
    let d = pki.dir.path();
    let mut cfg = String::new();
    for s in &systems {
        cfg += &redfish_bmc(
            d,
            &format!("rf-{}", s.name),
            &sushy,
            &s.uuid,
            &sushy.password,
        );
    }
    cfg += &redfish_bmc(d, "rf-discover", &single, "discover", &single.password);
    cfg += &redfish_bmc(d, "rf-ambiguous", &sushy, "discover", &sushy.password);
    // The same BMC as rf-discover, named by its system id: two machines on one system are
    // refused.
    cfg += &redfish_bmc(d, "rf-badpw", &single, &only[0].uuid, "not-the-password");
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;
    let uuid = |name: &str| {
        systems
            .iter()
            .find(|s| s.name == name)
            .unwrap()
            .uuid
            .clone()
    };

    // Independent machines run concurrently: sushy's delays would otherwise add up.
    let status = async {
        let r = c
            .request(req("rs", "rf-status", PowerAction::Status), ANSWER)
            .await?;
        ensure!(done(&r.outcome)?.0 == PowerState::On);
        ensure!(sushy.power_state(&uuid("status")).await? == "On");
        anyhow::Ok(())
    };
    let off = async {
        let r = c
            .request(req("roff", "rf-off", PowerAction::Off), ANSWER)
            .await?;
        done(&r.outcome)?;
        sushy.wait_power(&uuid("off"), "Off", SUSHY_APPLY).await?;
        ensure!(sushy.resets(&uuid("off")) == ["ForceOff"]);
        anyhow::Ok(())
    };
    let on = async {
        let r = c
            .request(req("ron", "rf-on", PowerAction::On), ANSWER)
            .await?;
        done(&r.outcome)?;
        sushy.wait_power(&uuid("on"), "On", SUSHY_APPLY).await?;
        anyhow::Ok(())
    };
    let soft = async {
        let r = c
            .request(req("rsoft", "rf-soft", PowerAction::SoftOff), ANSWER)
            .await?;
        done(&r.outcome)?;
        sushy.wait_power(&uuid("soft"), "Off", SUSHY_APPLY).await?;
        ensure!(sushy.resets(&uuid("soft")) == ["GracefulShutdown"]);
        anyhow::Ok(())
    };
    let cycle = async {
        // sushy offers no PowerCycle: the gateway falls back to ForceRestart, which the
        // emulator applies as off now, on later.
        let r = c
            .request(req("rcyc", "rf-cycle", PowerAction::Cycle), ANSWER)
            .await?;
        let (_, detail) = done(&r.outcome)?;
        ensure!(
            detail.contains("PowerCycle not offered, used ForceRestart"),
            "{detail}"
        );
        ensure!(sushy.resets(&uuid("cycle")) == ["ForceRestart"]);
        sushy.wait_power(&uuid("cycle"), "On", SUSHY_APPLY).await?;
        anyhow::Ok(())
    };
    let cycle_off = async {
        let r = c
            .request(req("rcycoff", "rf-cycle-off", PowerAction::Cycle), ANSWER)
            .await?;
        let (_, detail) = done(&r.outcome)?;
        ensure!(detail.contains("was off"), "{detail}");
        ensure!(sushy.resets(&uuid("cycle-off")) == ["On"]);
        sushy
            .wait_power(&uuid("cycle-off"), "On", SUSHY_APPLY)
            .await?;
        anyhow::Ok(())
    };
    let reset = async {
        let r = c
            .request(req("rrst", "rf-reset", PowerAction::Reset), ANSWER)
            .await?;
        done(&r.outcome)?;
        ensure!(sushy.resets(&uuid("reset")) == ["ForceRestart"]);
        sushy.wait_power(&uuid("reset"), "On", SUSHY_APPLY).await?;
        anyhow::Ok(())
    };
    let fence = async {
        let r = c
            .request(
                req("rfence", "rf-fence", PowerAction::Fence),
                Duration::from_secs(70),
            )
            .await?;
        let PowerOutcome::Done {
            state,
            confirmed_off_unix_ms,
            detail,
        } = &r.outcome
        else {
            anyhow::bail!("fence failed: {:?}", r.outcome);
        };
        ensure!(*state == PowerState::Off && confirmed_off_unix_ms.is_some());
        ensure!(detail.starts_with("fenced, confirmed off at "), "{detail}");
        ensure!(sushy.power_state(&uuid("fence")).await? == "Off");
        anyhow::Ok(())
    };
    let discover = async {
        let r = c
            .request(req("rdisc", "rf-discover", PowerAction::Status), ANSWER)
            .await?;
        ensure!(done(&r.outcome)?.0 == PowerState::On);
        let r = c
            .request(req("ramb", "rf-ambiguous", PowerAction::Status), ANSWER)
            .await?;
        let (detail, _) = failed(&r.outcome)?;
        ensure!(detail.contains("8 systems"), "{detail}");
        let t = Instant::now();
        let r = c
            .request(req("rbad", "rf-badpw", PowerAction::Off), ANSWER)
            .await?;
        let (detail, retriable) = failed(&r.outcome)?;
        ensure!(
            detail.contains("refused the credentials") && detail.contains("401"),
            "{detail}"
        );
        ensure!(!retriable);
        ensure!(t.elapsed() < Duration::from_secs(10));
        ensure!(
            single
                .resets(&FakeSystem::new(9, "only", true).uuid)
                .is_empty()
        );
        anyhow::Ok(())
    };
    let r = tokio::try_join!(
        status, off, on, soft, cycle, cycle_off, reset, fence, discover
    );
    if let Err(e) = r {
        anyhow::bail!(
            "{e:#}\n--- gateway log ---\n{}\n--- sushy log ---\n{}",
            gw.log(),
            sushy.log()
        );
    }
    let metrics = gw.metrics().await?;
    assert!(
        metrics.contains("protocol=\"redfish\",action=\"fence\",result=\"ok\""),
        "{metrics}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_clear_within_their_timeout_and_others_keep_working() -> Result<()> {
    let (good, hang, other) = tokio::try_join!(
        IpmiSim::start(true),
        IpmiSim::start(true),
        IpmiSim::start(true)
    )?;
    let pki = TestPki::new()?;
    let d = pki.dir.path();
    let dead_port = free_udp_port();
    let mut cfg = ipmi_bmc(d, "good", good.port, &good.username, &good.password);
    cfg += &ipmi_bmc(d, "hang", hang.port, &hang.username, &hang.password);
    // A BMC of its own: the gateway refuses two machines on one BMC.
    cfg += &ipmi_bmc(d, "badpw", other.port, &other.username, "wrong-password");
    cfg += &ipmi_bmc(d, "dead", dead_port, "admin", "x");
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;

    // Wrong password: a clear credentials failure, nothing done.
    let before = other.events().len();
    let t = Instant::now();
    let r = c
        .request(req("bp", "badpw", PowerAction::Off), ANSWER)
        .await?;
    let (detail, retriable) = failed(&r.outcome)?;
    assert!(detail.contains("refused the credentials"), "{detail}");
    assert!(!retriable);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(other.events().len(), before);
    assert!(other.power_is_on().await?);

    // Unreachable BMC (nothing listens): a clear failure within the request's limit.
    let mut r = req("dead1", "dead", PowerAction::Status);
    r.timeout_ms = 4000;
    let t = Instant::now();
    let r = c.request(r, ANSWER).await?;
    let (detail, retriable) = failed(&r.outcome)?;
    assert!(
        detail.contains("unreachable") || detail.contains("did not answer"),
        "{detail}"
    );
    assert!(retriable);
    assert!(
        t.elapsed() < Duration::from_millis(4500),
        "{:?}",
        t.elapsed()
    );

    // A fence to a BMC that does not answer sends its power off again until its own limit
    // (the answer may be what was lost), then says what it saw.
    let mut r = req("dead-fence", "dead", PowerAction::Fence);
    r.timeout_ms = 3000;
    let t = Instant::now();
    let r = c.request(r, ANSWER).await?;
    let took = t.elapsed();
    let (detail, retriable) = failed(&r.outcome)?;
    assert!(retriable);
    assert!(detail.contains("fence timed out after"), "{detail}");
    assert!(detail.contains("power off not answered after"), "{detail}");
    assert!(
        took >= Duration::from_millis(2900),
        "fence gave up early: {took:?}"
    );
    assert!(took < Duration::from_millis(4500), "fence took {took:?}");

    // A BMC that stops answering mid-action: it accepts the fence's power-off without applying
    // it, then freezes; the fence fails at its limit saying what it saw, while another BMC
    // keeps answering promptly.
    let r = c
        .request(req("h0", "hang", PowerAction::Status), ANSWER)
        .await?;
    done(&r.outcome)?;
    hang.ignore_off(true)?;
    let mut fence = req("hfence", "hang", PowerAction::Fence);
    fence.timeout_ms = 5000;
    let started = Instant::now();
    let pending = c.request(fence, ANSWER);
    let freeze = async {
        wait_until(
            "ipmi_sim got the fence's power off",
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async { Ok(hang.events().iter().any(|e| e == "set power 0")) },
        )
        .await?;
        hang.freeze()?;
        // While the frozen BMC's fence waits, the other BMC answers promptly.
        let t = Instant::now();
        let r = c
            .request(req("g1", "good", PowerAction::Status), ANSWER)
            .await?;
        ensure!(done(&r.outcome)?.0 == PowerState::On);
        ensure!(
            t.elapsed() < Duration::from_secs(2),
            "good BMC took {:?}",
            t.elapsed()
        );
        anyhow::Ok(())
    };
    let (r, f) = tokio::join!(pending, freeze);
    f?;
    let r = r?;
    let took = started.elapsed();
    let (detail, retriable) = failed(&r.outcome)?;
    assert!(retriable);
    assert!(detail.contains("fence timed out after"), "{detail}");
    assert!(
        detail.contains("did not answer") || detail.contains("still reads on"),
        "{detail}"
    );
    assert!(took < Duration::from_millis(6500), "fence took {took:?}");
    assert!(
        took >= Duration::from_millis(4900),
        "fence gave up early: {took:?}"
    );

    // Thawed, the BMC is usable again (the gateway replaces the dead session).
    hang.thaw()?;
    hang.ignore_off(false)?;
    wait_until(
        "hang BMC answers again",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let r = c
                .request(
                    req(&format!("h-{}", rand_suffix()), "hang", PowerAction::Status),
                    ANSWER,
                )
                .await?;
            Ok(matches!(r.outcome, PowerOutcome::Done { .. }))
        },
    )
    .await?;

    let metrics = gw.metrics().await?;
    assert!(
        metrics.contains("fleetmend_gateway_bmc_reachable{machine=\"dead\",protocol=\"ipmi\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fleetmend_gateway_bmc_reachable{machine=\"good\",protocol=\"ipmi\"} 1"),
        "{metrics}"
    );
    Ok(())
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_coordinator_certificates_may_command() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let cfg = ipmi_bmc(pki.dir.path(), "m1", sim.port, &sim.username, &sim.password);
    let gw = GatewayProc::start(&pki, &cfg).await?;

    let agent_hello = HelloBody::Agent(AgentHello {
        hostname: "web-1".into(),
        serial: "S".into(),
        addresses: vec![],
        agent_version: "test".into(),
        boot_id: "b".into(),
    });
    let admin_hello = HelloBody::Admin(AdminHello {
        client: "coordinatorctl".into(),
    });
    let cases = [
        (Role::Node, "web-1", agent_hello.clone()),
        (Role::Node, "web-1", GatewayClient::coordinator_hello()),
        (Role::Admin, "alice", admin_hello),
        (Role::Admin, "alice", GatewayClient::coordinator_hello()),
        (Role::Coordinator, "coord-1", agent_hello),
    ];
    for (role, name, hello) in cases {
        let tls = pki.material(role, name)?;
        match GatewayClient::connect(&tls, gw.quic, hello.clone()).await {
            Err(TransportError::Refused(r)) => {
                assert_eq!(r.code, RefusalCode::NotAuthorized, "{role} {hello:?}: {r}");
            }
            Err(other) => anyhow::bail!("{role} {hello:?}: expected a refusal, got {other}"),
            Ok(c) => {
                // Even if a session opened, no request may be executed.
                let r = c
                    .request(req("x", "m1", PowerAction::Off), Duration::from_secs(5))
                    .await;
                anyhow::bail!("{role} {hello:?} was accepted (request: {r:?})");
            }
        }
    }
    assert!(
        sim.events().is_empty(),
        "a refused peer caused {:?}",
        sim.events()
    );
    assert!(sim.power_is_on().await?);
    let log = gw.log();
    assert!(log.contains("refused a non-coordinator peer"), "{log}");
    assert!(log.contains("spiffe://fleet.test/admin/alice"), "{log}");
    let metrics = gw.metrics().await?;
    assert!(
        metrics.contains(
            "fleetmend_gateway_connections_refused_total{reason=\"not-a-coordinator\"} 5"
        ),
        "{metrics}"
    );

    // A coordinator may; and the gateway stops cleanly on SIGTERM.
    let c = coordinator(&pki, &gw).await?;
    let r = c
        .request(req("ok", "m1", PowerAction::Status), ANSWER)
        .await?;
    assert_eq!(done(&r.outcome)?.0, PowerState::On);
    drop(c);
    let st = gw.terminate().await?;
    assert!(st.success(), "exit status {st}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_exits_64_naming_the_key_and_check_prints_a_table() -> Result<()> {
    let bin = testkit::bmc_sim::gateway_binary()?;
    let dir = tempfile::tempdir()?;
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "x\n")?;
    let base = "listen = \"127.0.0.1:0\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";
    for (extra, key) in [
        ("colour = \"blue\"\n", "colour"),
        (
            &*format!(
                "[[bmc]]\nmachine = \"m\"\nprotocol = \"ipmi\"\nhost = \"h\"\nusername = \"u\"\npassword_file = \"{}\"\n[bmc.ipmi]\ncipher_suite = 17\n",
                pw.display()
            ),
            "bmc[0].ipmi.cipher_suite",
        ),
    ] {
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, format!("{base}{extra}"))?;
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::process::Command::new(&bin)
                .arg("--config")
                .arg(&p)
                .output(),
        )
        .await??;
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "stderr does not name {key}: {err}");
    }

    let sim = IpmiSim::start(false).await?;
    // A BMC that refuses the password: ipmi-rs logs its own WARN for it, which check
    // printed above the table that already says so.
    let refusing = IpmiSim::start(false).await?;
    let cfg = format!(
        "{base}{}{}{}",
        ipmi_bmc(
            dir.path(),
            "10.0.0.7",
            sim.port,
            &sim.username,
            &sim.password
        ),
        ipmi_bmc(dir.path(), "10.0.0.8", free_udp_port(), "admin", "x"),
        ipmi_bmc(
            dir.path(),
            "10.0.0.9",
            refusing.port,
            &refusing.username,
            "not-the-password"
        ),
    );
    let p = dir.path().join("check.toml");
    std::fs::write(&p, cfg)?;
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(&bin)
            .args(["check", "--config"])
            .arg(&p)
            .output(),
    )
    .await
    .context("check timed out")??;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "check must fail when a BMC does not answer"
    );
    // An INFO line per IPMI session opened came before the table; so did a library's WARN.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("INFO"), "{err}");
    assert!(!err.contains("ipmi_rs"), "{err}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("10.0.0.9") && l.contains("ERROR")),
        "{table}"
    );
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("MACHINE"), "{table}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("10.0.0.7") && l.contains(" off")),
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("10.0.0.8") && l.contains("ERROR")),
        "{table}"
    );
    // The TLS files "a", "b", "c" do not exist: said under the table, then the state line.
    assert!(
        lines[lines.len() - 2].starts_with("tls  FAIL  TLS files: "),
        "{table}"
    );
    assert!(
        lines.last().is_some_and(|l| l.starts_with("state  ")),
        "{table}"
    );
    Ok(())
}

/// `check` and a coordinator's status showed a Redfish system in the middle of a power change
/// as "unknown" with no word of why; both now carry the BMC's own word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redfish_power_change_under_way_is_shown_in_the_bmcs_words() -> Result<()> {
    let pki = TestPki::new()?;
    let mut sys = FakeSystem::new(1, "busy", true);
    sys.power = "PoweringOn".into();
    let sushy = Sushy::start(&pki.ca, std::slice::from_ref(&sys)).await?;
    let bmcs = redfish_bmc(
        pki.dir.path(),
        "rf-busy",
        &sushy,
        &sys.uuid,
        &sushy.password,
    );
    let gw = GatewayProc::start(&pki, &bmcs).await?;
    let c = coordinator(&pki, &gw).await?;
    let r = c
        .request(req("st-1", "rf-busy", PowerAction::Status), ANSWER)
        .await?;
    let (state, detail) = done(&r.outcome)?;
    ensure!(state == PowerState::Unknown, "{detail}");
    ensure!(detail.contains("\"PoweringOn\": a power-on"), "{detail}");
    let out = tokio::time::timeout(
        ANSWER,
        tokio::process::Command::new(testkit::bmc_sim::gateway_binary()?)
            .args(["check", "--config"])
            .arg(&gw.config)
            .output(),
    )
    .await??;
    let table = String::from_utf8_lossy(&out.stdout);
    ensure!(
        table.lines().any(|l| l.starts_with("rf-busy")
            && l.contains(" unknown ")
            && l.contains("the BMC says PowerState \"PoweringOn\"")),
        "{table}"
    );
    Ok(())
}

/// Two gateways on one `state_dir` would each run a request id the other ran: the second is
/// refused (exit 1, as for any unusable state directory) naming the first's pid, and
/// `bmc-gateway check` says who holds the directory; once the first is gone (even by
/// SIGKILL) a gateway starts on it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_state_dir_is_refused_naming_the_holder() -> Result<()> {
    let pki = TestPki::new()?;
    let state = tempfile::tempdir()?;
    let opts = GatewayOptions {
        quic: None,
        state_dir: Some(state.path().to_path_buf()),
        ..Default::default()
    };
    let first = GatewayProc::start_with(&pki, "", opts.clone()).await?;
    let pid = first.pid().context("first gateway's pid")?;
    let refused = match GatewayProc::start_with(&pki, "", opts.clone()).await {
        Ok(_) => anyhow::bail!("a second gateway started on the same state_dir"),
        Err(e) => format!("{e:#}"),
    };
    assert!(refused.contains("exited with exit status: 1"), "{refused}");
    assert!(
        refused.contains(&format!(
            "state_dir {} is in use by another bmc-gateway (pid {pid}",
            state.path().display()
        )),
        "{refused}"
    );

    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n",
            state.path().display()
        ),
    )?;
    let check = || async {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(testkit::bmc_sim::gateway_binary()?)
                .args(["check", "--config"])
                .arg(&cfg)
                .output(),
        )
        .await
        .context("check timed out")??;
        Ok::<_, anyhow::Error>(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let out = check().await?;
    assert!(
        out.contains(&format!(
            "state  held  {}: held by the gateway with pid {pid}",
            state.path().display()
        )),
        "{out}"
    );
    first.kill().await?;
    assert!(check().await?.contains("state  ok    "));
    let again = GatewayProc::start_with(&pki, "", opts).await?;
    let st = again.terminate().await?;
    assert!(st.success(), "exit status {st}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_client_fences_through_the_real_gateway() -> Result<()> {
    use coordinator::fence::proof::confirm_power_off;
    use coordinator::gateway::{GatewayTarget, PowerControl, PowerError, QuicGateways};
    use std::sync::Arc;

    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.3.1";
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password);
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let gws = QuicGateways::new(
        std::sync::Arc::new(std::sync::RwLock::new(
            pki.material(Role::Coordinator, "coord-1")?,
        )),
        "coord-1",
        vec![GatewayTarget {
            name: "rack-3".into(),
            address: gw.quic,
            server_name: "127.0.0.1".into(),
            racks: vec!["r3".into()],
            machines: vec![],
        }],
        Arc::new(|addr: &str| addr.starts_with("10.0.3.").then(|| "r3".to_string())),
        coordinator::lease_token::LeaseToken::fixed(GatewayClient::test_token()),
    );

    // The coordinator's fence proof, obtained from the real gateway and BMC.
    let proof = tokio::time::timeout(
        ANSWER,
        confirm_power_off(&gws, m, &format!("SN-{m}"), "fence-c1", 0),
    )
    .await
    .context("fence timed out")?
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(proof.address(), m);
    assert!(!sim.power_is_on().await?, "fenced machine still on");

    // A serial that does not match the gateway's record is refused without acting.
    let r = c_on(&gws, m).await?;
    done(&r.outcome)?;
    let before = sim.events().len();
    let mut wrong = req("serial-x", m, PowerAction::Off);
    wrong.serial = "OTHER".into();
    let r = tokio::time::timeout(ANSWER, gws.power(wrong)).await??;
    let (detail, _) = failed(&r.outcome)?;
    assert!(detail.contains("serial"), "{detail}");
    assert_eq!(sim.events().len(), before);
    assert!(sim.power_is_on().await?);

    // A machine no gateway serves is "not available", not a hang.
    let e = gws
        .power(req("nowhere", "10.9.9.9", PowerAction::Status))
        .await
        .unwrap_err();
    assert!(matches!(e, PowerError::NotAvailable { .. }), "{e}");
    Ok(())
}

async fn c_on(
    gws: &coordinator::gateway::QuicGateways,
    m: &str,
) -> Result<protocol::gateway::PowerResponse> {
    use coordinator::gateway::PowerControl;
    Ok(tokio::time::timeout(ANSWER, gws.power(req("on-c1", m, PowerAction::On))).await??)
}

/// Benchmark, not a test: chassis power status through the gateway on a warm session versus
/// spawning `ipmitool -I lanplus ... chassis power status`, against the same `ipmi_sim`.
/// Run: `cargo test --release -p fleetmend-tests --test bmc_gateway -- --ignored --nocapture bench_`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run by name"]
async fn bench_ipmi_status_gateway_vs_ipmitool() -> Result<()> {
    const N: usize = 50;
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let cfg = ipmi_bmc(pki.dir.path(), "b1", sim.port, &sim.username, &sim.password);
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;
    // Warm the session.
    let r = c
        .request(req("warm", "b1", PowerAction::Status), ANSWER)
        .await?;
    done(&r.outcome)?;
    let mut gw_times = Vec::new();
    let mut tool_times = Vec::new();
    for i in 0..N {
        let t = Instant::now();
        let r = c
            .request(req(&format!("b{i}"), "b1", PowerAction::Status), ANSWER)
            .await?;
        gw_times.push(t.elapsed());
        done(&r.outcome)?;
        let t = Instant::now();
        ensure!(sim.power_is_on().await?);
        tool_times.push(t.elapsed());
    }
    gw_times.sort();
    tool_times.sort();
    let (g, t) = (gw_times[N / 2], tool_times[N / 2]);
    println!(
        "bmc-gateway status (warm session, QUIC round trip included): median {:.2} ms over {N}",
        g.as_secs_f64() * 1e3
    );
    println!(
        "ipmitool -I lanplus chassis power status (process spawn + session): median {:.2} ms over {N}",
        t.as_secs_f64() * 1e3
    );
    println!(
        "ratio: gateway is {:.1}x faster",
        t.as_secs_f64() / g.as_secs_f64()
    );
    Ok(())
}

/// Issue 8: the at-most-once record survives the gateway's death. A gateway killed with
/// SIGKILL after executing a request answers its resend from the record (ipmi_sim sees
/// nothing new); a request it was killed in the middle of answers "outcome unknown" and is
/// not executed again either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_executing_answers_the_resend_from_its_record() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.0.1";
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password);
    let state = tempfile::tempdir()?;
    let opts = GatewayOptions {
        quic: None,
        state_dir: Some(state.path().to_path_buf()),
        ..Default::default()
    };
    let gw = GatewayProc::start_with(&pki, &cfg, opts.clone()).await?;
    let c = coordinator(&pki, &gw).await?;
    let first = c
        .request(req("kill-1", m, PowerAction::Cycle), ANSWER)
        .await?;
    done(&first.outcome)?;
    wait_until(
        "the cycle to complete in ipmi_sim",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async { Ok(sim.events().last().map(String::as_str) == Some("set power 1")) },
    )
    .await?;
    // A second request the gateway is killed in the middle of: the BMC is frozen so the
    // action is still running when SIGKILL comes.
    sim.freeze()?;
    let c2 = coordinator(&pki, &gw).await?;
    let pending = tokio::spawn(async move {
        let _ = c2.request(req("kill-2", m, PowerAction::Off), ANSWER).await;
    });
    wait_until(
        "kill-2 to start",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { Ok(gw.log().contains("power action started") && gw.log().contains("kill-2")) },
    )
    .await?;
    let quic = gw.quic;
    let before_kill = gw.kill().await?;
    pending.abort();
    // The off datagram sent before the kill waits in the frozen simulator's socket and is
    // carried out when it thaws: kill-2 ran once, on the first gateway. Let it land first.
    sim.thaw()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = sim.events();
    drop(c);

    let gw = GatewayProc::start_with(
        &pki,
        &cfg,
        GatewayOptions {
            quic: Some(quic),
            ..opts
        },
    )
    .await?;
    let c = coordinator(&pki, &gw).await?;
    let again = c
        .request(req("kill-1", m, PowerAction::Cycle), ANSWER)
        .await?;
    assert_eq!(again.outcome, first.outcome, "not the recorded answer");
    let interrupted = c
        .request(req("kill-2", m, PowerAction::Off), ANSWER)
        .await?;
    let (detail, retriable) = failed(&interrupted.outcome)?;
    assert!(
        detail.starts_with("outcome unknown: the gateway restarted"),
        "{detail}"
    );
    assert!(!retriable);
    // Nothing was executed for either resend.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        sim.events(),
        events,
        "the BMC was commanded again after the restart\nbefore the kill:\n{before_kill}\nafter:\n{}",
        gw.log()
    );
    // A new id is executed as usual; it reads the off kill-2 carried out before the kill.
    let r = c
        .request(req("kill-3", m, PowerAction::Status), ANSWER)
        .await?;
    assert_eq!(done(&r.outcome)?.0, PowerState::Off);
    Ok(())
}

/// Issue 31, fencing tokens at the gateway: once a coordinator of epoch 42 has spoken, a
/// request of epoch 41 of the same store is refused before any BMC is touched, also by a
/// gateway restarted in between (the epoch is in its durable record); the refusal is final
/// and counted. A repeated id is still answered from the record, and the refused id was not
/// remembered, so the successor can send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_coordinator_is_refused_by_the_gateway_also_after_its_restart() -> Result<()> {
    use protocol::fencing::FencingToken;
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.0.1";
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password);
    let state = tempfile::tempdir()?;
    let opts = GatewayOptions {
        quic: None,
        state_dir: Some(state.path().to_path_buf()),
        ..Default::default()
    };
    let token = |epoch| FencingToken {
        store: "0123456789abcdef0123456789abcdef".into(),
        epoch,
    };
    let gw = GatewayProc::start_with(&pki, &cfg, opts.clone()).await?;
    let c = coordinator(&pki, &gw).await?;
    assert_eq!(c.session.version, protocol::PROTOCOL_VERSION);
    let newer = c
        .request_fenced(req("new-1", m, PowerAction::Off), token(42), ANSWER)
        .await?;
    done(&newer.outcome)?;
    assert!(!sim.power_is_on().await?);
    let quic = gw.quic;
    gw.terminate().await?;
    drop(c);

    let gw = GatewayProc::start_with(
        &pki,
        &cfg,
        GatewayOptions {
            quic: Some(quic),
            ..opts
        },
    )
    .await?;
    let events = sim.events();
    let c = coordinator(&pki, &gw).await?;
    let old = c
        .request_fenced(req("old-1", m, PowerAction::On), token(41), ANSWER)
        .await?;
    let (detail, retriable) = failed(&old.outcome)?;
    assert!(
        detail.starts_with(&format!(
            "refused: epoch 41 is older than 42 for store {}; a newer coordinator leads",
            token(41).store
        )),
        "{detail}"
    );
    assert!(!retriable, "a refusal for an older epoch must be final");
    assert!(old.outcome.is_refused_epoch());
    // The deposed coordinator's resend of the successor's id is answered from the record.
    let again = c
        .request_fenced(req("new-1", m, PowerAction::Off), token(41), ANSWER)
        .await?;
    assert_eq!(again.outcome, newer.outcome);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sim.events(), events, "the BMC was touched for epoch 41");
    assert!(
        !sim.power_is_on().await?,
        "the deposed coordinator powered it on"
    );
    let metrics = gw.metrics().await?;
    assert!(
        metrics.contains(&format!(
            "fleetmend_gateway_requests_refused_older_epoch_total{{store=\"{}\"}} 1",
            token(41).store
        )),
        "{metrics}"
    );
    assert!(
        gw.log()
            .contains("refused a power request of an older fencing epoch"),
        "{}",
        gw.log()
    );
    // The successor (and any newer epoch) acts, with the very id that was refused.
    let r = c
        .request_fenced(req("old-1", m, PowerAction::On), token(43), ANSWER)
        .await?;
    done(&r.outcome)?;
    assert!(sim.power_is_on().await?);
    Ok(())
}

/// A reset (or cycle) that the BMC is slow to answer is not sent again: a resend is a new
/// request to the BMC, and a second reset would reset the machine twice. An off, which does
/// no harm twice, is still resent. ipmi_sim runs its control script inline and answers
/// nothing while the script sleeps, so every resend waits in its socket and is carried out
/// after the first; the script logs each one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_the_bmc_is_slow_to_answer_is_sent_once() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.0.1";
    // reply_timeout 500 ms × 3 attempts: 1.5 s of waiting in all.
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password);
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;
    let r = c.request(req("st", m, PowerAction::Status), ANSWER).await?;
    done(&r.outcome)?;

    sim.slow_set(Some(3))?;
    let r = c.request(req("rst", m, PowerAction::Reset), ANSWER).await?;
    // Let the simulator work through its socket: the one reset, and nothing after it.
    wait_until(
        "ipmi_sim to carry out the reset",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { Ok(sim.events().iter().any(|e| e.starts_with("set reset"))) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let resets = sim
        .events()
        .iter()
        .filter(|e| e.starts_with("set reset"))
        .count();
    assert_eq!(resets, 1, "events: {:?}", sim.events());
    let (detail, retriable) = failed(&r.outcome)?;
    assert!(detail.contains("sent once"), "{detail}");
    assert!(retriable, "{detail}");

    // An off is resent while the BMC is slow, and is carried out more than once: harmless.
    let r = c.request(req("off", m, PowerAction::Off), ANSWER).await?;
    let _ = r.outcome;
    sim.slow_set(None)?;
    wait_until(
        "ipmi_sim to carry out the resent offs",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async { Ok(sim.events().iter().filter(|e| *e == "set power 0").count() >= 2) },
    )
    .await?;
    Ok(())
}

/// SIGTERM while a power off was being carried out closed the coordinator's connection at
/// once: the BMC powered the machine off, and the coordinator learned nothing. The request
/// already taken is answered first, then the gateway exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_request_in_flight_before_stopping() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.0.1";
    // Replies awaited up to 4 s: the simulator carries the off out after 2 s.
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password)
        .replace("reply_timeout = \"500ms\"", "reply_timeout = \"4s\"");
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;
    let idle = coordinator(&pki, &gw).await?;
    done(
        &c.request(req("st", m, PowerAction::Status), ANSWER)
            .await?
            .outcome,
    )?;
    sim.slow_set(Some(2))?;
    let stop = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        gw.terminate().await
    };
    let (r, st) = tokio::join!(c.request(req("off", m, PowerAction::Off), ANSWER), stop);
    let (_, detail) = done(&r?.outcome)?;
    ensure!(detail.contains("power off accepted"), "{detail}");
    ensure!(st?.success(), "the gateway did not exit 0");
    // An idle connection is closed saying why, not dropped without a reason.
    let e = idle
        .request(req("late", m, PowerAction::Status), ANSWER)
        .await;
    let e = format!("{:#}", e.err().context("answered after the stop")?);
    ensure!(e.contains("gateway stopping"), "{e}");
    Ok(())
}

/// Invariant 5 end to end: two actions sent at the same moment for one BMC run one after the
/// other, never together. The gateway logs when each starts and finishes on the BMC; the
/// first must finish before the second starts, and ipmi_sim sees both in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_actions_on_one_bmc_run_one_after_the_other() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.0.1";
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password);
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let a = coordinator(&pki, &gw).await?;
    let b = coordinator(&pki, &gw).await?;
    let (ra, rb) = tokio::join!(
        a.request(req("seq-off-1", m, PowerAction::Off), ANSWER),
        b.request(req("seq-on-2", m, PowerAction::On), ANSWER),
    );
    done(&ra?.outcome)?;
    done(&rb?.outcome)?;
    let log = gw.log();
    let line = |needle: &str, id: &str| {
        log.lines()
            .position(|l| l.contains(needle) && l.contains(id))
            .with_context(|| format!("no {needle:?} for {id} in the gateway log:\n{log}"))
    };
    let (s1, f1) = (
        line("power action started", "seq-off-1")?,
        line("power action finished", "seq-off-1")?,
    );
    let (s2, f2) = (
        line("power action started", "seq-on-2")?,
        line("power action finished", "seq-on-2")?,
    );
    let (first, second) = if s1 < s2 {
        ((s1, f1), (s2, f2))
    } else {
        ((s2, f2), (s1, f1))
    };
    assert!(
        first.0 < first.1 && first.1 < second.0 && second.0 < second.1,
        "the two actions overlapped on one BMC:\n{log}"
    );
    let sets: Vec<String> = sim
        .events()
        .into_iter()
        .filter(|e| e.starts_with("set power"))
        .collect();
    let want = if s1 < s2 {
        ["set power 0", "set power 1"]
    } else {
        ["set power 1", "set power 0"]
    };
    assert_eq!(sets, want, "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_to_one_bmc_keep_its_minimum_interval() -> Result<()> {
    let sim = IpmiSim::start(true).await?;
    let pki = TestPki::new()?;
    let m = "10.0.0.1";
    let cfg = ipmi_bmc(pki.dir.path(), m, sim.port, &sim.username, &sim.password).replace(
        "protocol = \"ipmi\"\n",
        "protocol = \"ipmi\"\nmin_command_interval = \"1500ms\"\n",
    );
    let gw = GatewayProc::start(&pki, &cfg).await?;
    let c = coordinator(&pki, &gw).await?;
    // Three status reads in a row: at least two gaps of 1.5 s between them.
    let start = Instant::now();
    for i in 0..3 {
        let r = c
            .request(req(&format!("spaced-{i}"), m, PowerAction::Status), ANSWER)
            .await?;
        done(&r.outcome)?;
    }
    let took = start.elapsed();
    ensure!(
        took >= Duration::from_millis(2900),
        "three reads took {took:?}, under two 1.5 s intervals:\n{}",
        gw.log()
    );
    Ok(())
}
