//! The transport layer over real QUIC on loopback with certificates from the fleet PKI:
//! mutual TLS, the hello handshake, and refusals.

use std::net::SocketAddr;
use std::time::Duration;

use protocol::messages::{AdminHello, ClientHello, HelloBody, HelloReply, RefusalCode};
use protocol::pki::{Ca, IssueOptions};
use protocol::transport::{self, HelloError, TlsMaterial, TransportError};
use protocol::{Role, frame};

const LIMIT: Duration = Duration::from_secs(10);

fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
    ca.issue(role, name, &IssueOptions::loopback())
        .unwrap()
        .tls_material(ca.cert_pem().as_bytes())
        .unwrap()
}

fn admin_hello() -> HelloBody {
    HelloBody::Admin(AdminHello {
        client: "test".into(),
    })
}

/// A server that accepts every hello it can read and reports each outcome.
fn spawn_server(
    m: &TlsMaterial,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Result<String, String>>,
) {
    let ep = m.server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = ep.local_addr().unwrap();
    let td = m.identity().trust_domain.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(inc) = ep.accept().await {
            let tx = tx.clone();
            let td = td.clone();
            tokio::spawn(async move {
                match transport::accept_hello(inc, &td).await {
                    Ok(p) => {
                        let who = p.peer.uri();
                        let mut s = p.accept("test-server").await.unwrap();
                        // Echo one frame back, then wait for the client to go away.
                        if let Ok(Some(payload)) =
                            transport::read_payload(&mut s.recv, frame::MAX_FRAME_LEN).await
                        {
                            let _ = s
                                .send
                                .write_all(&(payload.len() as u32).to_be_bytes())
                                .await;
                            let _ = s.send.write_all(&payload).await;
                        }
                        let _ = tx.send(Ok(who));
                        s.conn.closed().await;
                    }
                    Err(HelloError::Refused { refusal, .. }) => {
                        let _ = tx.send(Err(format!("{:?}: {}", refusal.code, refusal.reason)));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("transport: {e}")));
                    }
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn mutual_tls_hello_and_echo() {
    let ca = Ca::generate("fleet.test").unwrap();
    let server = material(&ca, Role::Coordinator, "c1");
    let client = material(&ca, Role::Admin, "alice");
    let (addr, mut outcomes) = spawn_server(&server);
    let ep = client.client_endpoint(addr).unwrap();
    let mut s = transport::connect(&ep, addr, "127.0.0.1", Role::Coordinator, admin_hello())
        .await
        .unwrap();
    assert_eq!(s.peer.uri(), "spiffe://fleet.test/coordinator/c1");
    transport::write_msg(&mut s.send, &42u64, frame::MAX_FRAME_LEN)
        .await
        .unwrap();
    let back: u64 = tokio::time::timeout(LIMIT, transport::expect_msg(&mut s.recv, 64))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, 42);
    let who = tokio::time::timeout(LIMIT, outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(who, Ok("spiffe://fleet.test/admin/alice".to_string()));
}

#[tokio::test]
async fn client_from_another_ca_is_rejected() {
    let ca = Ca::generate("fleet.test").unwrap();
    let other = Ca::generate("fleet.test").unwrap();
    let server = material(&ca, Role::Coordinator, "c1");
    let (addr, _outcomes) = spawn_server(&server);
    // The client trusts the server's CA but presents a certificate from another CA.
    let foreign = other
        .issue(Role::Admin, "mallory", &IssueOptions::default())
        .unwrap();
    let client = foreign.tls_material(ca.cert_pem().as_bytes()).unwrap();
    let ep = client.client_endpoint(addr).unwrap();
    let r = transport::connect(&ep, addr, "127.0.0.1", Role::Coordinator, admin_hello()).await;
    assert!(r.is_err(), "a foreign client certificate was accepted");
}

#[tokio::test]
async fn server_of_the_wrong_role_is_refused_by_the_client() {
    let ca = Ca::generate("fleet.test").unwrap();
    let server = material(&ca, Role::Gateway, "rack-a");
    let client = material(&ca, Role::Node, "web-1");
    let (addr, _outcomes) = spawn_server(&server);
    let ep = client.client_endpoint(addr).unwrap();
    match transport::connect(&ep, addr, "127.0.0.1", Role::Coordinator, admin_hello()).await {
        Err(TransportError::UnexpectedPeer { expected, peer }) => {
            assert_eq!(expected, Role::Coordinator);
            assert_eq!(peer.role, Role::Gateway);
        }
        other => panic!("expected UnexpectedPeer, got {other:?}"),
    }
}

#[tokio::test]
async fn a_port_nothing_listens_on_is_told_from_a_silent_one() {
    let ca = Ca::generate("fleet.test").unwrap();
    let client = material(&ca, Role::Node, "web-1");
    // Nothing bound: the host answers the probe with ICMP "port unreachable", well before
    // the handshake's limit (a minute, which the test would otherwise wait for).
    let addr = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let ep = client.client_endpoint(addr).unwrap();
    let limit = std::time::Duration::from_secs(60);
    let r = transport::connect_within(
        &ep,
        addr,
        "127.0.0.1",
        Role::Coordinator,
        admin_hello(),
        limit,
    )
    .await;
    match r {
        Err(e @ TransportError::NothingListens { .. }) => {
            assert!(e.is_retriable());
            assert!(e.to_string().contains("nothing listens on"), "{e}");
        }
        other => panic!("expected NothingListens, got {other:?}"),
    }
    // A socket that holds the port and never answers: no refusal, the limit runs out.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let ep = client.client_endpoint(addr).unwrap();
    let short = std::time::Duration::from_millis(500);
    match transport::connect_within(
        &ep,
        addr,
        "127.0.0.1",
        Role::Coordinator,
        admin_hello(),
        short,
    )
    .await
    {
        Err(TransportError::NoAnswer { .. }) => {}
        other => panic!("expected NoAnswer, got {other:?}"),
    }
}

/// Opens a raw session (TLS ok) and sends `bytes` as the first stream's content.
async fn raw_first_frame(bytes: &[u8]) -> (HelloReply, Result<String, String>) {
    let ca = Ca::generate("fleet.test").unwrap();
    let server = material(&ca, Role::Coordinator, "c1");
    let client = material(&ca, Role::Admin, "alice");
    let (addr, mut outcomes) = spawn_server(&server);
    let ep = client.client_endpoint(addr).unwrap();
    let conn = ep.connect(addr, "127.0.0.1").unwrap().await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    let reply: HelloReply = tokio::time::timeout(
        LIMIT,
        transport::expect_msg(&mut recv, frame::MAX_FRAME_LEN),
    )
    .await
    .unwrap()
    .unwrap();
    let outcome = tokio::time::timeout(LIMIT, outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    (reply, outcome)
}

fn refusal_code(reply: &HelloReply) -> RefusalCode {
    match reply {
        HelloReply::Refused(r) => r.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn unknown_protocol_version_is_refused_with_reason() {
    let hello = ClientHello {
        protocol_version: protocol::PROTOCOL_VERSION + 1,
        body: admin_hello(),
    };
    let bytes = frame::encode_frame(&hello, frame::MAX_FRAME_LEN).unwrap();
    let (reply, outcome) = raw_first_frame(&bytes).await;
    assert_eq!(refusal_code(&reply), RefusalCode::UnsupportedVersion);
    assert!(outcome.unwrap_err().contains("not supported"));
}

#[tokio::test]
async fn oversized_hello_is_refused_before_it_is_read() {
    let mut bytes = ((frame::MAX_FRAME_LEN + 1) as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 16]);
    let (reply, _) = raw_first_frame(&bytes).await;
    assert_eq!(refusal_code(&reply), RefusalCode::FrameTooLarge);
}

#[tokio::test]
async fn random_bytes_are_refused_as_malformed() {
    let mut bytes = 12u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[
        0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x07, 0x42, 0x13, 0x99, 0x00,
    ]);
    let (reply, outcome) = raw_first_frame(&bytes).await;
    assert_eq!(refusal_code(&reply), RefusalCode::Malformed);
    assert!(outcome.is_err());
}

/// Opens bidirectional streams on `conn` until one is not granted within 300 ms; the count.
async fn streams_granted(conn: &quinn::Connection, up_to: u32) -> u32 {
    let mut opened = Vec::new();
    for n in 0..up_to {
        let wait = if n == 0 {
            LIMIT
        } else {
            Duration::from_millis(300)
        };
        match tokio::time::timeout(wait, conn.open_bi()).await {
            Ok(Ok(s)) => opened.push(s),
            Ok(Err(e)) => panic!("open_bi failed: {e}"),
            Err(_) => break,
        }
    }
    opened.len() as u32
}

#[tokio::test]
async fn agents_get_few_stream_slots_and_admins_many() {
    let ca = Ca::generate("fleet.test").unwrap();
    let server = material(&ca, Role::Coordinator, "c1");
    let (addr, _outcomes) = spawn_server(&server);

    let agent = material(&ca, Role::Node, "n1");
    let ep = agent.client_endpoint(addr).unwrap();
    let hello = HelloBody::Agent(protocol::messages::AgentHello {
        hostname: "n1".into(),
        serial: String::new(),
        addresses: vec![],
        agent_version: "test".into(),
        boot_id: "b".into(),
    });
    let s = transport::connect(&ep, addr, "127.0.0.1", Role::Coordinator, hello)
        .await
        .unwrap();
    // The hello stream holds one slot.
    assert_eq!(
        streams_granted(&s.conn, 20).await,
        transport::STREAMS_PER_CONNECTION - 1
    );

    let admin = material(&ca, Role::Admin, "alice");
    let ep = admin.client_endpoint(addr).unwrap();
    let s = transport::connect(&ep, addr, "127.0.0.1", Role::Coordinator, admin_hello())
        .await
        .unwrap();
    let want = transport::MULTIPLEXED_STREAMS - 1;
    assert_eq!(streams_granted(&s.conn, want + 5).await, want);
}

/// A raw echo server on `ep`: reads one 8-byte request per stream and answers with the same
/// 8 bytes in one write (one packet).
fn spawn_raw_echo(ep: quinn::Endpoint) {
    tokio::spawn(async move {
        while let Some(inc) = ep.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = inc.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let mut b = [0u8; 8];
                    if recv.read_exact(&mut b).await.is_ok() {
                        let _ = send.write_all(&b).await;
                    }
                }
            });
        }
    });
}

/// How many datagrams the client sent between writing one request and the reply first
/// being readable (the request, and the acknowledgement of the reply if it went at once),
/// and how many ACK_FREQUENCY frames it received. The client runs on this test's single
/// thread, so quinn's connection driver has handled the reply's packet (and sent whatever it
/// sends at once) before this task reads it. The fewest over a few requests: on a loaded
/// machine an echo slower than the request's probe timeout adds a probe datagram to a round.
async fn acks_sent_by_the_time_a_reply_is_read(
    client: &TlsMaterial,
    addr: SocketAddr,
) -> (u64, u64) {
    let ep = client.client_endpoint(addr).unwrap();
    let conn = tokio::time::timeout(LIMIT, ep.connect(addr, "127.0.0.1").unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut fewest = u64::MAX;
    for round in 0..5u64 {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        // Let every acknowledgement left pending go out (quinn delays one by at most 25 ms).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = conn.stats().udp_tx.datagrams;
        send.write_all(&round.to_be_bytes()).await.unwrap();
        let mut b = [0u8; 8];
        tokio::time::timeout(LIMIT, recv.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(u64::from_be_bytes(b), round);
        fewest = fewest.min(conn.stats().udp_tx.datagrams - before);
    }
    (fewest, conn.stats().frame_rx.ack_frequency)
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_asks_its_clients_to_acknowledge_at_once() {
    let ca = Ca::generate("fleet.test").unwrap();
    let server = material(&ca, Role::Coordinator, "c1");
    let client = material(&ca, Role::Node, "n1");

    // Our server configuration: the client acknowledges the one-packet reply while handling
    // it, not 25 ms later (one wakeup less per report for an agent).
    let ep = server
        .server_endpoint("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = ep.local_addr().unwrap();
    spawn_raw_echo(ep);
    let (sent, requests) = acks_sent_by_the_time_a_reply_is_read(&client, addr).await;
    assert!(requests >= 1, "the server sent no ACK_FREQUENCY frame");
    assert_eq!(
        sent, 2,
        "the request, then the reply's acknowledgement at once"
    );

    // Control: the same TLS with quinn's default transport settings, where the client
    // delays that acknowledgement, so the check above can tell the two apart.
    let crypto =
        quinn::crypto::rustls::QuicServerConfig::try_from(server.rustls_server_config().unwrap())
            .unwrap();
    let plain = quinn::Endpoint::server(
        quinn::ServerConfig::with_crypto(std::sync::Arc::new(crypto)),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let addr = plain.local_addr().unwrap();
    spawn_raw_echo(plain);
    let (sent, requests) = acks_sent_by_the_time_a_reply_is_read(&client, addr).await;
    assert_eq!(requests, 0);
    assert_eq!(
        sent, 1,
        "the request only: without the request the acknowledgement waits"
    );
}
