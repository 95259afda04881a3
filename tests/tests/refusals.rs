//! Issue 2's refusals, with real connections to a real coordinator process: no client
//! certificate, a certificate from another CA, a node certificate whose hello claims another
//! hostname, a node certificate calling the admin API, oversized frames, random bytes. Each
//! is refused with a reason the coordinator logs (and counts in /metrics), and after each a
//! real node-agent on the same coordinator is seen to report again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use protocol::Role;
use protocol::frame::{MAX_FRAME_LEN, encode_frame};
use protocol::messages::{
    AdminHello, AgentHello, CoordinatorReply, HelloBody, HelloReply, Refusal, RefusalCode,
};
use protocol::pki::{Ca, IssueOptions};
use protocol::transport::{
    Session, TlsFiles, TlsMaterial, TransportError, connect, expect_msg, provider,
};
use quinn::rustls;
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{
    CertFiles, Coordinator, CoordinatorOptions, Pki, inventory_toml, start_agent, wait_for,
};

const INTERVAL: Duration = Duration::from_millis(300);
const GOOD: (&str, &str) = ("10.0.0.1", "good-1");
/// Bound for anything the coordinator should do promptly.
const PROMPT: Duration = Duration::from_secs(15);

fn agent_hello(hostname: &str) -> HelloBody {
    HelloBody::Agent(AgentHello {
        hostname: hostname.into(),
        serial: String::new(),
        addresses: vec![],
        agent_version: "refusals-test".into(),
        boot_id: "boot".into(),
    })
}

fn material(files: &CertFiles) -> anyhow::Result<TlsMaterial> {
    Ok(TlsMaterial::load(&TlsFiles {
        ca: files.ca.clone(),
        cert: files.cert.clone(),
        key: files.key.clone(),
    })?)
}

async fn session(tls: &TlsMaterial, addr: SocketAddr, body: HelloBody) -> anyhow::Result<Session> {
    let ep = tls.client_endpoint(addr)?;
    Ok(connect(&ep, addr, "127.0.0.1", Role::Coordinator, body).await?)
}

fn expect_refused(r: Result<Session, TransportError>, code: RefusalCode) -> Refusal {
    match r {
        Err(TransportError::Refused(refusal)) if refusal.code == code => refusal,
        Err(e) => panic!("expected a {code:?} refusal, got error {e}"),
        Ok(s) => panic!("expected a {code:?} refusal, but {} was accepted", s.peer),
    }
}

/// Opens a raw QUIC connection with `tls` and a first stream carrying `bytes` instead of a
/// hello; returns the coordinator's hello reply.
async fn raw_hello(
    tls: &TlsMaterial,
    addr: SocketAddr,
    bytes: &[u8],
) -> anyhow::Result<HelloReply> {
    let ep = tls.client_endpoint(addr)?;
    let conn = ep.connect(addr, "127.0.0.1")?.await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(bytes).await?;
    let reply = tokio::time::timeout(PROMPT, expect_msg::<HelloReply>(&mut recv, MAX_FRAME_LEN))
        .await
        .context("no hello reply in time")??;
    Ok(reply)
}

/// Sends `bytes` on an accepted agent session and returns the coordinator's reply.
async fn in_session(
    tls: &TlsMaterial,
    addr: SocketAddr,
    hostname: &str,
    bytes: &[u8],
) -> anyhow::Result<CoordinatorReply> {
    let mut s = session(tls, addr, agent_hello(hostname)).await?;
    s.send.write_all(bytes).await?;
    let reply = tokio::time::timeout(
        PROMPT,
        expect_msg::<CoordinatorReply>(&mut s.recv, MAX_FRAME_LEN),
    )
    .await
    .context("no reply in time")??;
    // The coordinator closes the connection after a refusal.
    let closed = tokio::time::timeout(PROMPT, s.conn.closed()).await;
    if closed.is_err() {
        bail!("connection still open after a refusal");
    }
    Ok(reply)
}

/// Deterministic noise (xorshift), so a failure can be replayed.
fn noise(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Blocking test-kit calls from inside the async test.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Waits until the good agent has reported after now.
fn good_agent_still_reports(coord: &Coordinator) -> anyhow::Result<()> {
    let before = coord.machine(GOOD.0)?.last_report_at;
    wait_for("the good agent to report again", PROMPT, || {
        let d = coord.machine(GOOD.0).map_err(|e| e.to_string())?;
        if d.last_report_at > before && d.summary.state == "healthy" {
            Ok(())
        } else {
            Err(format!("{:?}", d.summary))
        }
    })
}

/// Waits until the coordinator log has `n` lines containing all of `needles`.
fn logged(coord: &Coordinator, needles: &[&str], n: usize) -> anyhow::Result<Vec<String>> {
    wait_for(&format!("{n} log lines with {needles:?}"), PROMPT, || {
        let lines: Vec<String> = coord
            .log_text()
            .lines()
            .filter(|l| needles.iter().all(|x| l.contains(x)))
            .map(str::to_string)
            .collect();
        if lines.len() >= n {
            Ok(lines)
        } else {
            Err(format!("{} lines", lines.len()))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_logged_and_others_keep_being_served() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = blocking(|| Pki::create(tmp.path(), "fleet.test"))?;
    let coord = blocking(|| {
        Coordinator::start(
            &tmp.path().join("coordinator"),
            &pki,
            &CoordinatorOptions {
                report_interval: INTERVAL,
                unreachable_grace: INTERVAL * 3,
                inventory: Some(inventory_toml(&[GOOD])),
                ..Default::default()
            },
        )
    })?;
    let addr = coord.quic;

    // A real agent that must keep being served throughout.
    let fixture = NodeFixture::builder(GOOD.1).nic("eth0").build()?;
    let good_tls = blocking(|| pki.issue("node", GOOD.1, &[]))?;
    let cfg = fixture.write_agent_config(
        &AgentConfig::new(
            &addr.to_string(),
            &good_tls.ca,
            &good_tls.cert,
            &good_tls.key,
        )
        .report_interval(INTERVAL),
    )?;
    let _agent = start_agent(GOOD.1, &cfg, &tmp.path().join("good-1.log"))?;
    blocking(|| coord.wait_for_state(GOOD.1, "healthy", Duration::from_secs(30)))?;

    // 1. No client certificate: the TLS handshake is refused by the server.
    {
        let mut roots = rustls::RootCertStore::empty();
        let ca_pem = std::fs::read(pki.ca_cert())?;
        for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&ca_pem) {
            let c: rustls::pki_types::CertificateDer<'static> = c?;
            roots.add(c)?;
        }
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![protocol::ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(cfg)?;
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
        ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let r = connect(
            &ep,
            addr,
            "127.0.0.1",
            Role::Coordinator,
            agent_hello(GOOD.1),
        )
        .await;
        assert!(r.is_err(), "a client without certificate was accepted");
        let lines = blocking(|| logged(&coord, &["connection failed before hello"], 1))?;
        assert!(lines[0].contains("error="), "{lines:?}");
        blocking(|| good_agent_still_reports(&coord))?;
    }

    // 2. A certificate from another CA, even for a registered hostname.
    {
        let other = Ca::generate("fleet.test")?;
        let issued = other.issue(Role::Node, GOOD.1, &IssueOptions::default())?;
        let ca_pem = std::fs::read(pki.ca_cert())?;
        let tls = issued.tls_material(&ca_pem)?;
        let r = session(&tls, addr, agent_hello(GOOD.1)).await;
        assert!(r.is_err(), "a certificate from another CA was accepted");
        blocking(|| logged(&coord, &["connection failed before hello"], 2))?;
        blocking(|| good_agent_still_reports(&coord))?;
    }

    // 3. A node certificate whose hello claims another hostname.
    let mallory = material(&blocking(|| pki.issue("node", "mallory", &[]))?)?;
    {
        let ep = mallory.client_endpoint(addr)?;
        let r = connect(
            &ep,
            addr,
            "127.0.0.1",
            Role::Coordinator,
            agent_hello(GOOD.1),
        )
        .await;
        let refusal = expect_refused(r, RefusalCode::IdentityMismatch);
        assert!(refusal.reason.contains("mallory"), "{refusal:?}");
        let lines = blocking(|| {
            logged(
                &coord,
                &[
                    "hostname differs from certificate",
                    "claimed=good-1",
                    "node/mallory",
                ],
                1,
            )
        })?;
        assert!(lines[0].contains("WARN"), "{lines:?}");
        blocking(|| good_agent_still_reports(&coord))?;
    }

    // 4. A node certificate calling the admin API.
    {
        let ep = mallory.client_endpoint(addr)?;
        let body = HelloBody::Admin(AdminHello {
            client: "refusals-test".into(),
        });
        let r = connect(&ep, addr, "127.0.0.1", Role::Coordinator, body).await;
        expect_refused(r, RefusalCode::NotAuthorized);
        blocking(|| {
            logged(
                &coord,
                &["role not authorized", "node/mallory", "the admin API"],
                1,
            )
        })?;
        blocking(|| good_agent_still_reports(&coord))?;
    }

    // 5. Oversized frames: as the hello, and inside an accepted session. The header alone
    // announces the size, and is refused before any payload is buffered.
    {
        let header = ((MAX_FRAME_LEN + 1) as u32).to_be_bytes();
        match raw_hello(&mallory, addr, &header).await? {
            HelloReply::Refused(r) => assert_eq!(r.code, RefusalCode::FrameTooLarge, "{r:?}"),
            other => panic!("oversized hello answered {other:?}"),
        }
        blocking(|| logged(&coord, &["connection refused", "frame-too-large"], 1))?;
        match in_session(&mallory, addr, "mallory", &(16u32 << 20).to_be_bytes()).await? {
            CoordinatorReply::Refused(r) => assert_eq!(r.code, RefusalCode::FrameTooLarge, "{r:?}"),
            other => panic!("oversized report answered {other:?}"),
        }
        blocking(|| logged(&coord, &["session refused", "frame-too-large"], 1))?;
        blocking(|| good_agent_still_reports(&coord))?;
    }

    // 6. Random bytes: as the hello, and as a framed agent message; plus raw UDP noise at
    // the QUIC port, which must not disturb anything.
    {
        match raw_hello(&mallory, addr, &noise(512, 0x9E37_79B9_7F4A_7C15)).await? {
            HelloReply::Refused(r) => assert!(
                matches!(
                    r.code,
                    RefusalCode::Malformed
                        | RefusalCode::FrameTooLarge
                        | RefusalCode::UnsupportedVersion
                ),
                "{r:?}"
            ),
            other => panic!("random hello answered {other:?}"),
        }
        blocking(|| logged(&coord, &["connection refused", "node/mallory"], 2))?;
        // A well-formed frame whose payload is noise (first byte: no such message variant).
        let mut payload = noise(64, 42);
        payload[0] = 0x7f;
        let mut frame = (payload.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&payload);
        match in_session(&mallory, addr, "mallory", &frame).await? {
            CoordinatorReply::Refused(r) => assert_eq!(r.code, RefusalCode::Malformed, "{r:?}"),
            other => panic!("random report answered {other:?}"),
        }
        blocking(|| logged(&coord, &["session refused", "malformed"], 1))?;
        let udp = std::net::UdpSocket::bind("127.0.0.1:0")?;
        for i in 0..50u64 {
            udp.send_to(&noise(1200, i + 1), addr)?;
        }
        blocking(|| good_agent_still_reports(&coord))?;
    }

    // A well-behaved session of the same certificate still works after all that.
    {
        let mut s = session(&mallory, addr, agent_hello("mallory")).await?;
        let bye = protocol::messages::AgentMessage::Goodbye(protocol::messages::Goodbye {
            reason: protocol::messages::GoodbyeReason::Restart,
        });
        s.send
            .write_all(&encode_frame(&bye, MAX_FRAME_LEN)?)
            .await?;
        let reply = tokio::time::timeout(
            PROMPT,
            expect_msg::<CoordinatorReply>(&mut s.recv, MAX_FRAME_LEN),
        )
        .await
        .context("no ack in time")??;
        assert_eq!(reply, CoordinatorReply::Ack { seq: 0 });
    }

    // What an operator sees (shown with --nocapture).
    for l in coord.log_text().lines().filter(|l| l.contains("WARN")) {
        println!("{l}");
    }

    // Every refusal is counted by reason.
    let (code, metrics) = blocking(|| coord.http_get("/metrics"))?;
    assert_eq!(code, 200);
    for (reason, at_least) in [
        ("handshake-failed", 2),
        ("identity-mismatch", 1),
        ("not-authorized", 1),
        ("frame-too-large", 2),
        ("malformed", 1),
    ] {
        let n: u64 = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "fleetmend_connections_refused_total{{reason=\"{reason}\"}} "
                ))
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(n >= at_least, "{reason}: {n} < {at_least}\n{metrics}");
    }
    // The coordinator process is still the one we started.
    blocking(|| good_agent_still_reports(&coord))?;
    Ok(())
}
