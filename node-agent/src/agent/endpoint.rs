//! The agent's QUIC client endpoints: one per address family, kept for the agent's life.

use std::net::SocketAddr;
use std::sync::Arc;

use protocol::transport::TransportError;
use quinn::Endpoint;

use super::Agent;

impl Agent {
    /// The client endpoint for `peer`'s family, with the TLS material loaded now: made once
    /// (on an ephemeral port, as `TlsMaterial::client_endpoint` makes one but with quinn's
    /// timers on timerfds, [`crate::timer`]: a connection's delayed ACK and loss detection
    /// timers then cost one wakeup each instead of up to two, and no write to the runtime's
    /// eventfd), then reused by every connection.
    ///
    /// Not one per connection: each endpoint allocates a receive buffer of about 2.9 MiB
    /// (quinn: 1472-byte datagrams × 64 GRO segments × a batch of 32). The first is mapped
    /// and only touched where datagrams land, but once one is freed glibc raises its mmap
    /// threshold above that size, so the next comes from the heap, is zeroed whole and stays
    /// resident after it is freed: one reconnect (a coordinator restart) left the agent
    /// 2.9 MiB larger for good.
    pub(super) fn client_endpoint(&self, peer: SocketAddr) -> Result<Endpoint, TransportError> {
        let family = usize::from(peer.is_ipv6());
        let mut kept = self.endpoints.lock().expect("endpoints lock");
        let mut endpoint = match &kept[family] {
            Some(e) => e.clone(),
            None => {
                let e = self.new_client_endpoint(peer)?;
                kept[family] = Some(e.clone());
                e
            }
        };
        // The default client config is the handle's own: set it on this clone with the TLS
        // files as last loaded (a reload may have renewed the certificate).
        endpoint.set_default_client_config(self.tls.quinn_client_config()?);
        Ok(endpoint)
    }

    fn new_client_endpoint(&self, peer: SocketAddr) -> Result<Endpoint, TransportError> {
        let bind: SocketAddr = if peer.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let bound = |source| TransportError::Bind { addr: bind, source };
        let socket = std::net::UdpSocket::bind(bind).map_err(bound)?;
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            None,
            socket,
            Arc::new(crate::timer::TimerfdRuntime),
        )
        .map_err(bound)?;
        Ok(endpoint)
    }
}
