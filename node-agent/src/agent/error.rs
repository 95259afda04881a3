//! The errors that end the agent, with their retry and exit-code policy, and those of one
//! connection or report round, after which it reconnects.

use std::time::Duration;

use protocol::messages::{Refusal, RefusalCode};
use protocol::transport::TransportError;
use tracing::{error, warn};

use crate::config::ConfigError;
use crate::node::NodeError;

/// The certificate does not chain to the configured CA (another fleet's CA, or expired):
/// refused at start and at a reload alike.
pub use protocol::transport::ForeignCertificate;

/// Checks that `tls`, loaded from `files`, chains to its own CA.
pub fn check_own_chain(
    tls: &protocol::transport::TlsMaterial,
    files: &crate::config::CoordinatorConfig,
) -> Result<(), ForeignCertificate> {
    tls.check_own_chain(&files.cert, &files.ca, "ca")
}

/// Errors that end the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration cannot run an agent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The certificate, key or CA could not be loaded.
    #[error("TLS files: {0}")]
    Tls(#[source] TransportError),
    /// The certificate does not name this node.
    #[error(
        "certificate identity {identity} does not match this node: expected role node and name {hostname:?}; issue a certificate for this hostname or set `hostname`"
    )]
    IdentityMismatch {
        /// Identity in the certificate.
        identity: String,
        /// This node's hostname.
        hostname: String,
    },
    /// The certificate does not chain to the configured CA.
    #[error(transparent)]
    ForeignCertificate(#[from] ForeignCertificate),
    /// The certificate or the CA has expired: the coordinator would refuse every
    /// connection until a new one is installed.
    #[error(
        "{detail} ({cert}, CA {ca}); install a new certificate (`coordinatorctl pki issue --role node --name {name}`) and start the agent again"
    )]
    Expired {
        /// The certificate file.
        cert: std::path::PathBuf,
        /// The CA file.
        ca: std::path::PathBuf,
        /// The name in the certificate.
        name: String,
        /// What expired, when.
        detail: String,
    },
    /// Node facts (hostname, boot id) cannot be read.
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl AgentError {
    /// Whether restarting the agent unchanged could help (TLS files may still be being
    /// provisioned); configuration and identity problems need an operator.
    pub fn is_retriable(&self) -> bool {
        matches!(self, AgentError::Tls(_))
    }

    /// Process exit code: 64 (EX_USAGE) for configuration problems, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_)
            | AgentError::IdentityMismatch { .. }
            | AgentError::ForeignCertificate(_)
            | AgentError::Expired { .. } => 64,
            _ => 1,
        }
    }
}

/// Why one connection or report round failed; always followed by a reconnect.
#[derive(Debug, thiserror::Error)]
pub(super) enum RoundError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("coordinator refused: {0}")]
    Refused(Refusal),
    #[error("cannot resolve coordinator address {addr}: {detail}")]
    Resolve { addr: String, detail: String },
    #[error("no answer to report {seq} within {timeout:?}")]
    ReplyTimeout { seq: u64, timeout: Duration },
    #[error(transparent)]
    Node(#[from] NodeError),
    /// Every coordinator tried answered that it does not lead (the last one's words).
    #[error("no coordinator tried leads now: {0}")]
    Standby(String),
}

impl RoundError {
    /// Logs the failure before a reconnect in `retry_in`; a refusal of this node's
    /// `identity`, or of its certificate, is an error a person must act on.
    pub(super) fn log(&self, retry_in: Duration, identity: &protocol::Identity) {
        let e = self;
        // To the millisecond: `1.213s`, not `1.213322628s`.
        let retry = protocol::duration::display(retry_in);
        let refusal = match e {
            RoundError::Refused(r) | RoundError::Transport(TransportError::Refused(r)) => Some(r),
            _ => None,
        };
        match refusal {
            Some(r)
                if matches!(
                    r.code,
                    RefusalCode::IdentityMismatch | RefusalCode::NotAuthorized
                ) =>
            {
                error!(
                    code = ?r.code,
                    reason = %r.reason,
                    identity = %identity,
                    retry_in = %retry,
                    "COORDINATOR REFUSED THIS NODE'S IDENTITY: reports are not being accepted; check the certificate, the hostname and the coordinator's inventory"
                );
            }
            Some(r) => {
                warn!(code = ?r.code, reason = %r.reason, retry_in = %retry, "coordinator refused");
            }
            None if matches!(
                e,
                RoundError::Transport(TransportError::CertificateRejected { dates: true, .. })
            ) =>
            {
                error!(
                    error = %e,
                    identity = %identity,
                    retry_in = %retry,
                    "COORDINATOR REJECTED THIS NODE'S CERTIFICATE FOR ITS DATES: reports are not being accepted; compare the clocks of this host, the coordinator and the CA host (`timedatectl status`), or renew an expired certificate"
                );
            }
            None if matches!(
                e,
                RoundError::Transport(TransportError::CertificateRejected { .. })
            ) =>
            {
                error!(
                    error = %e,
                    identity = %identity,
                    retry_in = %retry,
                    "COORDINATOR REJECTED THIS NODE'S CERTIFICATE: reports are not being accepted; issue the certificate from the coordinator's CA"
                );
            }
            None if matches!(
                e,
                RoundError::Transport(TransportError::ServerCertificateRefused { .. })
            ) =>
            {
                error!(
                    error = %e,
                    retry_in = %retry,
                    "CANNOT VERIFY THE COORDINATOR'S CERTIFICATE: reports are not being sent; check `ca` and `server_name`"
                );
            }
            None => warn!(error = %e, retry_in = %retry, "coordinator connection failed"),
        }
    }
}
