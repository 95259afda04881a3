//! Telling a stopped server from a silent network: QUIC alone cannot.

use std::net::SocketAddr;

/// Completes only when `addr` is known to have nothing listening: its host answered a
/// datagram with ICMP "port unreachable", which a connected UDP socket reports as
/// `ECONNREFUSED`. QUIC ignores those, so without this a stopped coordinator on a reachable
/// host costs the whole `--timeout` before a client can say anything. The probe is one
/// byte, which a QUIC server drops unread; it runs beside the real connection attempt and
/// adds no delay. A host that drops packets silently, or anything else, never completes it.
pub async fn port_refused(addr: SocketAddr) {
    let probe = async {
        let bind: SocketAddr = if addr.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let sock = tokio::net::UdpSocket::bind(bind).await.ok()?;
        sock.connect(addr).await.ok()?;
        sock.send(&[0]).await.ok()?;
        let mut buf = [0u8; 1];
        loop {
            match sock.recv(&mut buf).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Some(()),
                Err(_) => return None,
                // Something answered a byte of nothing: not a refusal; keep listening.
                Ok(_) => {}
            }
        }
    };
    if probe.await.is_none() {
        std::future::pending::<()>().await;
    }
}
