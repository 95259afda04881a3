//! Which etcd member the store talks to: one client per endpoint, and the one requests go
//! to until it fails.
//!
//! etcd-client's own channel balances over every endpoint and cannot say which one a
//! request went to, so it keeps sending to a member that is down or hung: with one member of
//! three killed, a third of the requests went to it; with one frozen (SIGSTOP, a stalled
//! disk, a host cut off without a reset), a third of them waited out the whole timeout
//! (measured: 36 of 120 requests failed, 260 s for 60 writes and reads). Here every request
//! goes to the current member; the first failure of that member's
//! ([`EtcdStore::bounded`](super::EtcdStore::bounded)) moves the store to the next one, so a
//! member lost costs at most the request that found it, and a read not even that (it is
//! sent again).
//!
//! There is no moving back: any member of a healthy cluster answers as well as another
//! (writes and linearizable reads go through etcd's leader whichever member is asked).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::store::repeated::RepeatedFailure;

/// How often a move is logged at INFO; the others (etcd down, every request moving on) at
/// DEBUG.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// One client per endpoint, and the current one.
pub(super) struct Members {
    clients: Vec<Client>,
    /// The endpoint of each client, for the log.
    endpoints: Vec<String>,
    current: AtomicUsize,
    /// Moves are logged as a run of failures is: the first, then once a minute.
    log: Mutex<RepeatedFailure>,
}

impl Members {
    /// A client per endpoint. etcd-client connects lazily, so this sends nothing.
    pub(super) async fn connect(
        endpoints: &[String],
        opts: &ConnectOptions,
    ) -> Result<Self, etcd_client::Error> {
        let mut clients = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            clients.push(Client::connect([e], Some(opts.clone())).await?);
        }
        Ok(Self {
            clients,
            endpoints: endpoints.to_vec(),
            current: AtomicUsize::new(0),
            log: Mutex::new(RepeatedFailure::new(LOG_EVERY)),
        })
    }

    /// The member requests go to now: its index (for [`Members::avoid`]) and client.
    pub(super) fn current(&self) -> (usize, &Client) {
        let i = self.current.load(Ordering::Relaxed) % self.clients.len();
        (i, &self.clients[i])
    }

    /// Moves away from member `i` after it failed (`why`), unless another failure already
    /// did (two requests failing on one member move the store once, not twice); whether it
    /// moved.
    pub(super) fn avoid(&self, i: usize, why: &dyn std::fmt::Display) -> bool {
        let next = (i + 1) % self.clients.len();
        if next == i
            || self
                .current
                .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let (from, to) = (&self.endpoints[i], &self.endpoints[next]);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(moves) = log.failed("moved", tokio::time::Instant::now()) {
            tracing::info!(%from, %to, error = %why, moves, "an etcd member failed a request; sending requests to the next one (said once a minute)");
        } else {
            tracing::debug!(%from, %to, error = %why, "an etcd member failed a request; sending requests to the next one");
        }
        true
    }
}
