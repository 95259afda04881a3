//! The real binary under a fake service manager: `NOTIFY_SOCKET` is a unix datagram socket
//! this test reads, `WATCHDOG_USEC` arms the watchdog, and a QUIC coordinator stand-in acks
//! reports. Checks READY once started (before the coordinator answered: `systemctl start`
//! must not wait for it), the status line, WATCHDOG pings, STOPPING and a goodbye with exit
//! 0 on SIGTERM.

#[allow(unreachable_pub, dead_code, missing_docs, unused_imports)]
#[path = "../../tests/src/fixture.rs"]
mod fixture;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fixture::{AgentConfig, NodeFixture};
use protocol::frame::MAX_FRAME_LEN;
use protocol::identity::Role;
use protocol::messages::{AgentMessage, CoordinatorReply, GoodbyeReason};
use protocol::pki::{Ca, IssueOptions};
use protocol::transport::{accept_hello, read_msg, write_msg};

/// Upper bound for every wait here.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_at_start_not_at_the_first_report_watchdog_pings_and_goodbye_on_sigterm() {
    let ca = Ca::generate("notify.local").unwrap();
    let coord = ca
        .issue(
            Role::Coordinator,
            "coord",
            &IssueOptions {
                ips: vec!["127.0.0.1".parse().unwrap()],
                ..Default::default()
            },
        )
        .unwrap();
    let node = ca
        .issue(Role::Node, "notify-node", &IssueOptions::default())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = node.write(dir.path(), false).unwrap();
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, ca.cert_pem()).unwrap();
    let fx = NodeFixture::builder("notify-node")
        .nic("eth0")
        .build()
        .unwrap();

    let tls = coord.tls_material(ca.cert_pem().as_bytes()).unwrap();
    let ep = tls.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = ep.local_addr().unwrap();
    let reports = Arc::new(AtomicU64::new(0));
    let goodbye = Arc::new(std::sync::Mutex::new(None::<GoodbyeReason>));
    let (r, g, server) = (reports.clone(), goodbye.clone(), ep.clone());
    tokio::spawn(async move {
        while let Some(inc) = server.accept().await {
            let Ok(p) = accept_hello(inc, "notify.local").await else {
                continue;
            };
            let Ok(mut s) = p.accept("coord").await else {
                continue;
            };
            let (r, g) = (r.clone(), g.clone());
            tokio::spawn(async move {
                while let Ok(Some(m)) = read_msg::<AgentMessage>(&mut s.recv, MAX_FRAME_LEN).await {
                    let seq = match m {
                        AgentMessage::Report(rep) => {
                            // Hold the first answer back a little: READY must not wait for it.
                            if rep.seq == 1 {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                            }
                            r.fetch_add(1, Ordering::SeqCst);
                            rep.seq
                        }
                        AgentMessage::Goodbye(b) => {
                            *g.lock().unwrap() = Some(b.reason);
                            0
                        }
                    };
                    if write_msg(&mut s.send, &CoordinatorReply::Ack { seq }, MAX_FRAME_LEN)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });

    let notify_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let config = fx
        .write_agent_config(
            &AgentConfig::new(&addr.to_string(), &ca_path, &cert, &key)
                .report_interval(Duration::from_millis(100)),
        )
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["run", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .env("FLEETMEND_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();

    // Collect notifications until a few watchdog pings followed READY.
    let mut seen: Vec<String> = Vec::new();
    let mut reports_at_ready = None;
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 512];
    loop {
        assert!(Instant::now() < deadline, "notifications so far: {seen:?}");
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).trim().to_string();
            if msg == "READY=1" {
                reports_at_ready = Some(reports.load(Ordering::SeqCst));
            }
            seen.push(msg);
        }
        let pings_after_ready = seen
            .iter()
            .skip_while(|m| *m != "READY=1")
            .filter(|m| *m == "WATCHDOG=1")
            .count();
        if pings_after_ready >= 3 {
            break;
        }
    }
    assert_eq!(seen[0], "STATUS=connecting to coordinator", "{seen:?}");
    assert_eq!(
        reports_at_ready,
        Some(0),
        "READY waited for the coordinator's answer: {seen:?}"
    );
    assert_eq!(seen.iter().filter(|m| *m == "READY=1").count(), 1);
    assert!(seen.contains(&"STATUS=reporting".to_string()), "{seen:?}");

    // Stop as systemd would.
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).trim().to_string());
        }
        assert!(
            Instant::now() < deadline,
            "agent did not exit after SIGTERM"
        );
    };
    while let Ok(n) = sock.recv(&mut buf) {
        seen.push(String::from_utf8_lossy(&buf[..n]).trim().to_string());
    }
    assert_eq!(status.code(), Some(0));
    assert!(seen.contains(&"STOPPING=1".to_string()), "{seen:?}");
    assert_eq!(*goodbye.lock().unwrap(), Some(GoodbyeReason::Restart));
}
