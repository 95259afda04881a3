//! Whether this coordinator can reach each gateway over QUIC now, watched all the time
//! rather than learnt at the first fence: `fleetmend_power_gateway_reachable{gateway}` for the
//! `FleetmendGatewayUnreachable` alert. A gateway's own `/metrics` scrape can succeed while
//! the coordinator cannot reach its QUIC port (a firewall, a wrong address, a certificate it
//! refuses), which only this side sees.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::QuicGateways;
use crate::metrics::MetricsSource;

/// How often each gateway is reached. 30 s: a gateway gone is known (and alerted on after
/// the rule's `for`) long before a fence needs it; with the connection kept open, a reach is
/// a look at its state (QUIC keep-alives every second), not a new handshake.
pub const REACH_EVERY: Duration = Duration::from_secs(30);

/// One attempt's limit: the QUIC handshake's and the hello's own bounds are 10 s.
const REACH_LIMIT: Duration = Duration::from_secs(10);

/// The last reach of each gateway, by name: `true` reached.
#[derive(Debug, Default)]
pub(super) struct Reach {
    last: std::sync::Mutex<BTreeMap<String, bool>>,
}

impl Reach {
    /// Records `ok` for `gateway`; the previous value, if any.
    fn record(&self, gateway: &str, ok: bool) -> Option<bool> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(gateway.to_string(), ok)
    }
}

impl QuicGateways {
    /// Reaches every gateway at once every [`REACH_EVERY`] until `stop`, keeping the
    /// connection a power request would use, and records whether each answered (logged
    /// when that changes). Sends no request: no BMC is touched.
    pub async fn watch_reach(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let each = (0..self.targets.len()).map(|i| {
                let me = self.clone();
                async move {
                    let t = &me.targets[i];
                    let r = match tokio::time::timeout(REACH_LIMIT, me.connection(i, false)).await
                    {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!(
                            "no answer within {}",
                            protocol::duration::display(REACH_LIMIT)
                        )),
                    };
                    let before = me.reach.record(&t.name, r.is_ok());
                    match (&r, before) {
                        (Err(e), Some(true) | None) => tracing::warn!(
                            gateway = %t.name,
                            address = %t.address,
                            error = %e,
                            "gateway unreachable over QUIC: power actions and fences through it would fail or hold"
                        ),
                        (Ok(()), Some(false)) => {
                            tracing::info!(gateway = %t.name, address = %t.address, "gateway reachable again")
                        }
                        _ => {}
                    }
                }
            });
            futures::future::join_all(each).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(REACH_EVERY) => {}
            }
        }
    }
}

impl MetricsSource for QuicGateways {
    fn render(&self, out: &mut String) {
        out.push_str("# HELP fleetmend_power_gateway_reachable 1 when this coordinator reached the gateway over QUIC at its last look (every 30 s), 0 when it did not.\n# TYPE fleetmend_power_gateway_reachable gauge\n");
        let last = self.reach.last.lock().unwrap_or_else(|p| p.into_inner());
        for (gateway, ok) in last.iter() {
            let _ = writeln!(
                out,
                "fleetmend_power_gateway_reachable{{gateway=\"{gateway}\"}} {}",
                u8::from(*ok)
            );
        }
    }
}
