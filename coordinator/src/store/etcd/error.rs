//! What can go wrong talking to etcd, in words an operator can act on.
//!
//! Every variant names what was asked (the operation and its key, relative to nothing: the
//! full key as `etcdctl get` takes it) and, where it helps, the endpoints. [`EtcdError::
//! is_storage_failure`] says whether the store itself failed (etcd down, no quorum, a
//! timeout, the space quota) as opposed to a request that was wrong or lost a race, so
//! [`crate::store::StoreHealth`] counts only the former. Not here: retrying (callers decide
//! with [`EtcdError::is_retriable`]).

use std::path::PathBuf;
use std::time::Duration;

/// Errors from the etcd store driver.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The configuration cannot work (no endpoints, a bad prefix, a bad URL).
    #[error("[store] etcd configuration: {0}")]
    Config(String),
    /// A TLS file named in the configuration cannot be read.
    #[error("[store] etcd TLS file {path}: {source}; fix the path or the file's permissions")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// etcd could not be reached at start.
    #[error(
        "etcd at {endpoints} cannot be reached ({reason}); check that etcd runs there, that \
         `[store] endpoints` names it and, with TLS, that `[store]`'s CA, certificate and key \
         are the ones etcd expects"
    )]
    Unreachable {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// What the client said.
        reason: String,
    },
    /// A request took longer than the configured `request_timeout`.
    #[error(
        "etcd at {endpoints} did not answer {op} {key} within {after:?}; etcd is down, has \
         lost its quorum or is overloaded"
    )]
    Timeout {
        /// What was asked.
        op: &'static str,
        /// The key (or prefix).
        key: String,
        /// The bound that passed.
        after: Duration,
        /// The configured endpoints.
        endpoints: String,
    },
    /// etcd answered a request with an error.
    #[error("etcd at {endpoints}: {op} {key} failed: {reason}")]
    Request {
        /// What was asked.
        op: &'static str,
        /// The key (or prefix).
        key: String,
        /// The configured endpoints.
        endpoints: String,
        /// What etcd or the transport said, explained ([`explain`]).
        reason: String,
        /// True when the store itself failed rather than the request.
        storage: bool,
    },
    /// A compare-and-swap kept losing to other writers.
    #[error(
        "etcd key {key} kept changing under this coordinator ({attempts} attempts); another \
         writer is busy on it: is a second coordinator writing to the same prefix?"
    )]
    Contended {
        /// The contended key.
        key: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A record changed under this coordinator since it read it: it was not overwritten.
    #[error(
        "etcd key {key} was changed by another writer since this coordinator read it, so \
         it was not overwritten; is another coordinator acting on the same prefix?"
    )]
    Conflict {
        /// The key.
        key: String,
    },
    /// This coordinator's leadership has ended: the write was refused (by etcd's compare on
    /// the leader key, or before sending once the term was over) and nothing was written.
    #[error(
        "this coordinator no longer leads (its epoch {epoch} ended: {why}); the write to {key} \
         was refused and nothing was written; it stops acting and steps down ({leader_key})"
    )]
    Deposed {
        /// The epoch this coordinator held.
        epoch: i64,
        /// What the leader key showed, or why the term ended.
        why: String,
        /// The key the refused write was for.
        key: String,
        /// The leader key.
        leader_key: String,
    },
    /// A value is not the JSON this coordinator expects.
    #[error(
        "etcd key {key} does not hold what this coordinator expects ({source}); it was \
         written by another program or by hand: restore it or delete it"
    )]
    Json {
        /// The key.
        key: String,
        /// Cause.
        source: serde_json::Error,
    },
    /// A value would be too large for one etcd request.
    #[error(
        "the value for etcd key {key} is {size} bytes, more than the {limit} bytes this \
         store allows in one value (etcd refuses requests over 1.5 MiB by default)"
    )]
    TooLarge {
        /// The key.
        key: String,
        /// The value's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The store under this prefix was written by a newer coordinator.
    #[error(
        "the etcd store under {prefix} is at schema version {found}, newer than this \
         coordinator's {known}; upgrade the coordinator"
    )]
    TooNew {
        /// The key prefix.
        prefix: String,
        /// Version found.
        found: u32,
        /// Newest version known here.
        known: u32,
    },
    /// The prefix holds keys but no schema version: not a Fleetmend store.
    #[error(
        "the etcd keys under {prefix} hold no Fleetmend schema version ({key} is missing) \
         but other keys ({example}): this prefix belongs to another program; choose another \
         `[store] prefix`"
    )]
    NotOurs {
        /// The key prefix.
        prefix: String,
        /// The schema key.
        key: String,
        /// One key found there.
        example: String,
    },
    /// `coordinator migrate` into this prefix started and did not finish: what is there is
    /// part of a store, and a coordinator on it would act on half of its state.
    #[error(
        "the store under {prefix} is a copy that `coordinator migrate` started from {from} \
         and did not finish ({key} is set): run `coordinator migrate --from-sqlite {from}` \
         again to finish it (it starts the copy over; the SQLite file was only read)"
    )]
    MigrationUnfinished {
        /// The key prefix.
        prefix: String,
        /// The marker key.
        key: String,
        /// The SQLite file being copied.
        from: String,
    },
}

impl EtcdError {
    /// True when the store itself failed (unreachable, no quorum, a timeout, out of space):
    /// [`crate::store::StoreHealth`] counts it and `/healthz` says so.
    pub fn is_storage_failure(&self) -> bool {
        match self {
            EtcdError::Unreachable { .. } | EtcdError::Timeout { .. } => true,
            EtcdError::Request { storage, .. } => *storage,
            _ => false,
        }
    }

    /// True for conditions that may pass by themselves (etcd down or slow, a lost race).
    pub fn is_retriable(&self) -> bool {
        self.is_storage_failure() || matches!(self, EtcdError::Contended { .. })
    }

    /// True when this coordinator's leadership ended under the write ([`EtcdError::Deposed`]).
    pub fn is_deposed(&self) -> bool {
        matches!(self, EtcdError::Deposed { .. })
    }

    /// True when an operator must fix the configuration or the data (exit code 64).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            EtcdError::Config(_)
                | EtcdError::TlsFile { .. }
                | EtcdError::TooNew { .. }
                | EtcdError::NotOurs { .. }
                | EtcdError::MigrationUnfinished { .. }
        )
    }
}

/// When [`crate::store::etcd::EtcdStore::bounded`] sends a failed request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// At once, most likely to another member: the connection was refused or could not be
    /// opened (hyper's "tcp connect error"; tonic's transport errors are raised only while
    /// connecting), so etcd never saw the request; or a repeatable request (anything but a
    /// transaction) failed on a broken connection or went unanswered.
    Elsewhere,
    /// After a pause, within the timeout: the member refused the request for want of a
    /// leader (the client asks for one, and etcd checks before handling the request), or
    /// a repeatable request was abandoned as the leader changed under it. An election, or
    /// a quorum lost.
    Later,
}

/// Whether the request `e` answers may be sent again, and when; `repeatable` says that
/// whatever became of it, sending it again does no harm (everything but a transaction).
/// `None` for a transaction that may have been applied (a broken connection, a timeout,
/// "leader changed"): a compare-and-swap that landed would read as lost the second time.
pub fn resend(e: &etcd_client::Error, repeatable: bool) -> Option<Resend> {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(s) if s.message().contains("no leader") => Some(Resend::Later),
        E::GRpcStatus(s) if repeatable && s.message().contains("leader changed") => {
            Some(Resend::Later)
        }
        E::GRpcStatus(s)
            if s.code() == Code::Unavailable
                && (s.message().contains("tcp connect error")
                    || s.message().contains("Connection refused")) =>
        {
            Some(Resend::Elsewhere)
        }
        E::GRpcStatus(s)
            if repeatable
                && matches!(
                    s.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
                ) =>
        {
            Some(Resend::Elsewhere)
        }
        E::TransportError(_) => Some(Resend::Elsewhere),
        _ => None,
    }
}

/// The client's error in words that say what to do, and whether the store itself failed
/// (as opposed to the request being wrong).
pub fn explain(e: &etcd_client::Error) -> (String, bool) {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) => {
            let msg = s.message();
            let what = if msg.contains("database space exceeded") || msg.contains("NOSPACE") {
                "etcd's space quota is used up (alarm NOSPACE): compact and defragment it, \
                 then `etcdctl alarm disarm`"
                    .to_string()
            } else if msg.contains("no leader") || msg.contains("leader changed") {
                "etcd has no leader: a majority of its members is down or cut off".to_string()
            } else if msg.contains("too large") {
                return (
                    format!("etcd refused the request as too large ({msg})"),
                    false,
                );
            } else if s.code() == tonic::Code::Unauthenticated
                || s.code() == tonic::Code::PermissionDenied
            {
                return (
                    format!("etcd refused this client ({msg}): check the TLS client certificate"),
                    true,
                );
            } else {
                match s.code() {
                    tonic::Code::Unavailable => {
                        format!("etcd is unavailable ({msg}): is it running and reachable?")
                    }
                    tonic::Code::DeadlineExceeded => {
                        format!("etcd did not answer in time ({msg})")
                    }
                    tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                        return (format!("etcd refused the request: {msg}"), false);
                    }
                    _ => format!("{:?}: {msg}", s.code()),
                }
            };
            (what, true)
        }
        E::TransportError(t) => (
            format!("cannot talk to etcd ({t}): is it running and reachable?"),
            true,
        ),
        E::IoError(io) => (format!("I/O error talking to etcd: {io}"), true),
        other => (other.to_string(), false),
    }
}
