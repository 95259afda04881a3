//! The etcd store driver: the connection every etcd-backed area shares, and the few key-value
//! moves they are built from.
//!
//! [`EtcdStore::connect`] takes [`EtcdSettings`] (endpoints, the client's TLS files, a key
//! prefix, a per-request timeout), proves that etcd answers (so "etcd down at start" is an
//! error naming the endpoints, not a hang), and checks or creates the schema under the prefix
//! ([`schema`]). After that every request is bounded twice: by the gRPC deadline of the client
//! and by a timer around the call, so a frozen etcd (SIGSTOP, a partition) costs at most the
//! timeout, never a stuck loop. Requests go to one member at a time and move on from one
//! that fails ([`members`]), and what cannot be applied twice is sent again
//! ([`EtcdStore::bounded`]), so one member down or hung costs at most the request in flight.
//!
//! Values are JSON, so `etcdctl get --prefix /fleetmend/` shows an operator what the store
//! holds (as CKE and sabakan store theirs). Keys are `<prefix>/<area>/…`; the layout is in
//! `docs/design.md` ("The etcd store"). The moves ([`kv`]): read one key or a directory (paged,
//! so 10,000 entries never exceed a response limit), a transaction of compares and writes,
//! compare-and-swap on a key's `mod_revision`, create-if-absent, an append-only sequence (the
//! repair queue's write index, as CKE keeps it) and bounded histories.
//!
//! Every failure of etcd itself is counted in the same [`StoreHealth`] as SQLite's, so
//! `/healthz` answers 503 with the reason; [`health`] keeps it current without writing (a
//! linearizable read and the alarm list), so an idle coordinator never moves etcd's
//! revision.
//!
//! A leading coordinator's handle carries a [`fence::Fence`] ([`EtcdStore::fenced`]): every
//! write it makes also compares the leader key's create revision with its epoch, so a
//! deposed leader writes nothing.
//!
//! Not here: what each area stores (its own file per area), the election (`crate::ha`).

pub mod error;
pub mod fence;
pub mod health;
pub mod kv;
mod members;
pub mod scan;
pub mod schema;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

pub use error::EtcdError;
pub use kv::{Sequence, Txn, Versioned};

use super::StoreHealth;

/// The default key prefix: every key of the store starts with it.
pub const DEFAULT_PREFIX: &str = "/fleetmend";

/// The default bound on one request. etcd answers a healthy write in milliseconds and
/// elects a new leader within its election timeout (1 s by default), so 5 s rides out an
/// election while a stopped etcd still shows as an error within one `/healthz` period.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The default bound on opening a connection: a few round trips on a LAN, with room for a
/// TLS handshake on a loaded host.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client's TLS files for etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    /// The CA that signed etcd's serving certificates.
    pub ca: PathBuf,
    /// The client certificate (etcd's `--client-cert-auth`); with `key`, or neither.
    pub cert: Option<PathBuf>,
    /// Its key.
    pub key: Option<PathBuf>,
}

/// How to reach etcd and where in it the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Client URLs (`http://host:2379`, `https://host:2379`).
    pub endpoints: Vec<String>,
    /// TLS files, for `https://` endpoints.
    pub tls: Option<EtcdTlsFiles>,
    /// Key prefix (`/fleetmend` by default): several fleets can share one etcd.
    pub prefix: String,
    /// The bound on each request.
    pub request_timeout: Duration,
    /// The bound on opening a connection.
    pub connect_timeout: Duration,
}

impl EtcdSettings {
    /// The settings a coordinator's `[store]` section names (checked there; the prefix is
    /// written with a trailing `/` in the configuration, without it here).
    pub fn configured(store: &crate::store::config::StoreConfig) -> Result<Self, EtcdError> {
        let c = store
            .etcd_settings()
            .map_err(|(key, why)| EtcdError::Config(format!("{key}: {why}")))?;
        let prefix = c.prefix.trim_end_matches('/');
        Ok(Self {
            endpoints: c.endpoints,
            tls: c.ca.map(|ca| EtcdTlsFiles {
                ca,
                cert: c.identity.as_ref().map(|i| i.0.clone()),
                key: c.identity.map(|i| i.1),
            }),
            prefix: if prefix.is_empty() {
                DEFAULT_PREFIX.to_string()
            } else {
                prefix.to_string()
            },
            request_timeout: c.timeout,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        })
    }

    /// Settings for `endpoints` with the default prefix and timeouts and no TLS.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            tls: None,
            prefix: DEFAULT_PREFIX.to_string(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// With another prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// With TLS files.
    pub fn with_tls(mut self, tls: EtcdTlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }

    /// With another request timeout.
    pub fn with_request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// What is wrong with these settings, if anything, before any connection is tried.
    pub fn validate(&self) -> Result<(), EtcdError> {
        if self.endpoints.is_empty() {
            return Err(EtcdError::Config(
                "`endpoints` is empty: name at least one etcd client URL".into(),
            ));
        }
        for e in &self.endpoints {
            let https = e.starts_with("https://");
            if !https && !e.starts_with("http://") {
                return Err(EtcdError::Config(format!(
                    "endpoint {e:?} is not a URL: write http://HOST:PORT or https://HOST:PORT"
                )));
            }
            if https && self.tls.is_none() {
                return Err(EtcdError::Config(format!(
                    "endpoint {e} is https but no TLS files are set: set `tls_ca` (and \
                     `tls_cert`/`tls_key` when etcd asks for client certificates)"
                )));
            }
            if !https && self.tls.is_some() {
                return Err(EtcdError::Config(format!(
                    "endpoint {e} is plain http but TLS files are set: write https://"
                )));
            }
        }
        check_prefix(&self.prefix)?;
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(EtcdError::Config("timeouts must be above zero".into()));
        }
        if let Some(t) = &self.tls
            && t.cert.is_some() != t.key.is_some()
        {
            return Err(EtcdError::Config(
                "`tls_cert` and `tls_key` go together: set both or neither".into(),
            ));
        }
        Ok(())
    }
}

/// `s` as one key level: `%` and `/` escaped, so an address or a name never adds a level
/// to a key (`10.0.0.1` stays `10.0.0.1`, `a/b` becomes `a%2Fb`).
pub fn key_level(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

/// A prefix is an absolute etcd key path without a trailing slash: `/fleetmend`,
/// `/fleetmend/prod`.
fn check_prefix(p: &str) -> Result<(), EtcdError> {
    let ok = p.starts_with('/')
        && p.len() > 1
        && !p.ends_with('/')
        && !p.contains("//")
        && p.chars().all(|c| c.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(EtcdError::Config(format!(
            "prefix {p:?} must start with '/', not end with '/', and hold printable ASCII \
             without spaces (e.g. \"/fleetmend\" or \"/fleetmend/prod\")"
        )))
    }
}

/// A connection to etcd with the store's prefix. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    /// One client per member and the one requests go to ([`members`]). Behind an `Arc`:
    /// a client holds one gRPC client per etcd service (nearly 4 KiB), and a `Store` is
    /// cloned into every task.
    members: Arc<members::Members>,
    settings: Arc<EtcdSettings>,
    endpoints: Arc<str>,
    health: Arc<StoreHealth>,
    /// What an area keeps about its keys between calls (the repair queue: each entry's
    /// `mod_revision`), one value per type, shared by every clone.
    areas: Arc<Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>>,
    /// The leader's fence, when this handle is a leader's: compared in every write.
    fence: Option<fence::Fence>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.settings.prefix)
            .field("epoch", &self.fence.as_ref().map(|f| f.epoch()))
            .finish()
    }
}

impl EtcdStore {
    /// Connects, proves that etcd answers, and brings the schema under the prefix to this
    /// coordinator's version ([`schema::ensure`]). An error naming the endpoints when etcd
    /// cannot be reached.
    /// A store that `coordinator migrate` has not finished copying is refused
    /// ([`EtcdError::MigrationUnfinished`]).
    pub async fn connect(settings: EtcdSettings) -> Result<Self, EtcdError> {
        let store = Self::connect_only(settings).await?;
        schema::refuse_unfinished(&store).await?;
        schema::ensure(&store).await?;
        Ok(store)
    }

    /// Connects and proves that etcd answers, without touching the schema (`coordinator
    /// check`, which only reads).
    pub async fn connect_only(settings: EtcdSettings) -> Result<Self, EtcdError> {
        settings.validate()?;
        let endpoints: Arc<str> = settings.endpoints.join(",").into();
        let mut opts = ConnectOptions::new()
            .with_timeout(settings.request_timeout)
            .with_connect_timeout(settings.connect_timeout)
            // Refuse requests a member without a leader would queue until its deadline.
            .with_require_leader(true);
        if let Some(t) = &settings.tls {
            opts = opts.with_tls(tls_options(t)?);
        }
        let named = endpoints.to_string();
        let unreachable = move |reason: String| EtcdError::Unreachable {
            endpoints: named.clone(),
            reason,
        };
        let members = tokio::time::timeout(
            settings.connect_timeout,
            members::Members::connect(&settings.endpoints, &opts),
        )
        .await
        .map_err(|_| unreachable(format!("no answer within {:?}", settings.connect_timeout)))?
        .map_err(|e| unreachable(error::explain(&e).0))?;
        let store = Self {
            members: Arc::new(members),
            settings: Arc::new(settings),
            endpoints,
            health: Arc::new(StoreHealth::default()),
            areas: Arc::default(),
            fence: None,
        };
        // The client connects lazily: one linearizable read proves a member answers and the
        // cluster has a leader.
        store
            .get_raw(&store.key(schema::SCHEMA_KEY))
            .await
            .map_err(|e| match e {
                EtcdError::Timeout { after, .. } => {
                    unreachable(format!("no answer within {after:?}"))
                }
                EtcdError::Request { reason, .. } => unreachable(reason),
                other => other,
            })?;
        Ok(store)
    }

    /// This handle fenced by a leadership term: every write it makes commits only while the
    /// leader key `leader_rel` (relative to the prefix) still has the term's epoch as its
    /// create revision, and is not sent at all once the term is over
    /// ([`EtcdError::Deposed`]). Clones share the areas' state with this handle.
    pub fn fenced(&self, leader_rel: &str, term: Arc<fence::Term>) -> Self {
        let mut s = self.clone();
        s.fence = Some(fence::Fence {
            key: self.key(leader_rel),
            term,
        });
        s
    }

    /// The fence its writes carry, if it is a leader's handle.
    pub fn fence(&self) -> Option<&fence::Fence> {
        self.fence.as_ref()
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &EtcdSettings {
        &self.settings
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.settings.prefix
    }

    /// The endpoints, comma-separated (for messages).
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// What the store has seen of its own health (shared with `/healthz`).
    pub fn health(&self) -> &StoreHealth {
        &self.health
    }

    /// The shared health, for a coordinator that hands it to `/healthz`.
    pub fn health_arc(&self) -> Arc<StoreHealth> {
        self.health.clone()
    }

    /// The full key of `rel` (`repair/entries/…` → `/fleetmend/repair/entries/…`).
    pub fn key(&self, rel: &str) -> String {
        format!("{}/{}", self.settings.prefix, rel.trim_start_matches('/'))
    }

    /// The client of the member requests go to now (for the election's watches and the
    /// tests' own checks; requests go through [`EtcdStore::bounded`], which moves on from
    /// a member that fails).
    pub fn client(&self) -> &Client {
        self.members.current().1
    }

    /// The member requests go to now, for [`EtcdStore::avoid_member`].
    pub(crate) fn current_member(&self) -> usize {
        self.members.current().0
    }

    /// Moves requests off member `i` if they still go there: for a failure seen outside
    /// [`EtcdStore::bounded`] (a lease keep-alive unanswered on the stream opened there).
    pub(crate) fn avoid_member(&self, i: usize, why: &dyn std::fmt::Display) {
        self.avoid(i, why);
    }

    /// Moves off member `i` and counts it (`fleetmend_store_etcd_member_moves_total`).
    fn avoid(&self, i: usize, why: &dyn std::fmt::Display) {
        if self.members.avoid(i, why) {
            self.health.moved_member();
        }
    }

    /// Runs one request under the store's timeout, mapping errors and counting failures of
    /// etcd itself in [`StoreHealth`].
    ///
    /// Each attempt goes to the current member ([`members`]) with its client; one that
    /// fails for want of etcd (not for the request's own fault), or goes unanswered, moves
    /// the store to the next member. `call` makes the request, and is called again within
    /// the one timeout when sending it again cannot apply it twice ([`error::resend`]):
    /// - at once, up to [`attempts`] times, when its connection was refused, or a
    ///   [`repeatable`] request's connection broke or it went unanswered for half the
    ///   timeout: the next attempt goes to the next member.
    /// - every 50 ms until the timeout when it was refused for want of a leader, or a
    ///   repeatable request was abandoned as the leader changed: an etcd election (a second
    ///   or two after its leader's host goes down) delays requests instead of failing them;
    ///   a quorum lost for the whole timeout fails with that reason.
    ///
    /// A transaction that may have reached etcd is never sent twice: a compare-and-swap
    /// that landed would then read as lost.
    pub(crate) async fn bounded<T, F, C>(
        &self,
        op: &'static str,
        key: &str,
        mut call: C,
    ) -> Result<T, EtcdError>
    where
        C: FnMut(&Client) -> F,
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let after = self.settings.request_timeout;
        let deadline = tokio::time::Instant::now() + after;
        let repeatable = repeatable(op);
        // A request that hangs (sent to a member frozen, or waiting on a leader that died)
        // is cut at half the timeout and sent again, unless it is a transaction, which may
        // only wait.
        let per_attempt = if repeatable { after / 2 } else { after };
        let mut attempts = attempts(self.settings.endpoints.len());
        // What etcd said last, and whether a member said it has no leader: that member is
        // alive, so the request waits out the timeout for an election instead of failing
        // once the dead members' refusals have used up the attempts, and the error then
        // says "no leader" rather than "refused".
        let mut last: Option<EtcdError> = None;
        let mut no_leader: Option<EtcdError> = None;
        let res = loop {
            let cut = deadline.min(tokio::time::Instant::now() + per_attempt);
            let (member, client) = self.members.current();
            let e = match tokio::time::timeout_at(cut, call(client)).await {
                Ok(Ok(v)) => break Ok(v),
                Ok(Err(e)) => e,
                Err(_) => {
                    self.avoid(member, &format_args!("no answer to {op} {key}"));
                    if cut < deadline && (attempts > 1 || no_leader.is_some()) {
                        attempts = attempts.saturating_sub(1);
                        tracing::debug!(op, key, "no answer; sending it again");
                        continue;
                    }
                    break Err(no_leader.or(last).unwrap_or(EtcdError::Timeout {
                        op,
                        key: key.to_string(),
                        after,
                        endpoints: self.endpoints.to_string(),
                    }));
                }
            };
            if error::explain(&e).1 {
                self.avoid(member, &e);
            }
            let pause = match error::resend(&e, repeatable) {
                Some(error::Resend::Elsewhere) if attempts > 1 || no_leader.is_some() => {
                    attempts = attempts.saturating_sub(1);
                    Duration::ZERO
                }
                Some(error::Resend::Later) => {
                    no_leader = Some(self.request_error(op, key, &e));
                    Duration::from_millis(50)
                }
                // Every member refused, as many times as there are attempts: etcd is down.
                Some(error::Resend::Elsewhere) => break Err(self.request_error(op, key, &e)),
                None => break Err(self.request_error(op, key, &e)),
            };
            tracing::debug!(op, key, error = %e, "etcd did not handle the request; sending it again");
            let next = tokio::time::Instant::now() + pause;
            if next >= deadline {
                break Err(no_leader.unwrap_or_else(|| self.request_error(op, key, &e)));
            }
            tokio::time::sleep_until(next).await;
            // A leader's write whose term ended while it waited is not sent again (etcd would
            // refuse it on the epoch's compare; it is not even sent, as before the first).
            if let Some(f) = self.fence.as_ref().filter(|_| !repeatable)
                && let Err(why) = f.term.check()
            {
                break Err(kv::deposed(f, why, key));
            }
            last = Some(self.request_error(op, key, &e));
        };
        if let Err(e) = &res
            && e.is_storage_failure()
        {
            self.health.failed(e.to_string());
        }
        res
    }

    fn request_error(&self, op: &'static str, key: &str, e: &etcd_client::Error) -> EtcdError {
        let (reason, storage) = error::explain(e);
        EtcdError::Request {
            op,
            key: key.to_string(),
            endpoints: self.endpoints.to_string(),
            reason,
            storage,
        }
    }

    /// The area state of type `T` of this store (made on first use), shared by its clones.
    pub(crate) fn area<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut areas = self.areas.lock().unwrap_or_else(|p| p.into_inner());
        let any = areas
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()))
            .clone();
        any.downcast::<T>().expect("one value per type")
    }

    /// Marks the store healthy after a write (or a probe) that reached etcd's quorum.
    pub(crate) fn wrote(&self) {
        self.health.wrote();
    }
}

/// Whether [`EtcdStore::bounded`] may send `op` again whatever became of the first attempt:
/// everything but a transaction. Reads change nothing; a second lease grant leaves a lease
/// nobody uses, which expires; a second revoke finds the lease gone; a stream (keep-alive,
/// watch) opened twice leaves the first to be dropped. A transaction's compare-and-swap that
/// landed would read as lost the second time.
fn repeatable(op: &str) -> bool {
    op != "txn"
}

/// How many times [`EtcdStore::bounded`] sends a request at once again (its connection
/// refused, a repeatable one's broken or unanswered): four per endpoint, so each member is
/// tried more than once before a request fails; with every member down, the refusals take a
/// few milliseconds.
fn attempts(endpoints: usize) -> u32 {
    u32::try_from(endpoints.max(1) * 4).unwrap_or(u32::MAX)
}

fn read_tls_file(p: &PathBuf) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(p).map_err(|source| EtcdError::TlsFile {
        path: p.clone(),
        source,
    })
}

fn tls_options(t: &EtcdTlsFiles) -> Result<TlsOptions, EtcdError> {
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read_tls_file(&t.ca)?));
    if let (Some(cert), Some(key)) = (&t.cert, &t.key) {
        tls = tls.identity(Identity::from_pem(
            read_tls_file(cert)?,
            read_tls_file(key)?,
        ));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_work_are_refused_with_what_to_write() {
        let ok = EtcdSettings::new(vec!["http://127.0.0.1:2379".into()]);
        ok.validate().unwrap();
        let e = EtcdSettings::new(vec![])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("`endpoints` is empty"), "{e}");
        let e = EtcdSettings::new(vec!["127.0.0.1:2379".into()])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("http://HOST:PORT"), "{e}");
        let e = EtcdSettings::new(vec!["https://e:2379".into()])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tls_ca`"), "{e}");
        for bad in ["fleetmend", "/", "/fleetmend/", "/a//b", "/a b"] {
            let e = ok.clone().with_prefix(bad).validate().unwrap_err();
            assert!(e.is_config(), "{bad}: {e}");
            assert!(e.to_string().contains("must start with '/'"), "{e}");
        }
        ok.clone()
            .with_prefix("/fleetmend/prod")
            .validate()
            .unwrap();
        let e = ok
            .clone()
            .with_request_timeout(Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("above zero"), "{e}");
    }

    #[tokio::test]
    async fn etcd_down_at_start_is_an_error_naming_the_endpoints_within_the_bound() {
        // A port nothing listens on: bind one, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ep = format!("http://127.0.0.1:{port}");
        let mut s =
            EtcdSettings::new(vec![ep.clone()]).with_request_timeout(Duration::from_secs(1));
        s.connect_timeout = Duration::from_secs(1);
        let start = std::time::Instant::now();
        let e = EtcdStore::connect(s).await.unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let msg = e.to_string();
        assert!(matches!(e, EtcdError::Unreachable { .. }), "{e:?}");
        assert!(
            msg.contains(&ep) && msg.contains("cannot be reached"),
            "{msg}"
        );
    }
}
