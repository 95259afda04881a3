//! Why a coordinator could not start, and what that means for its exit status.

use std::net::SocketAddr;

use protocol::transport::TransportError;

use crate::fleet::FleetError;
use crate::inventory::InventoryError;
use crate::store::StoreError;

/// Why the coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The TLS files are unusable, or the QUIC port cannot be bound (the transport's own
    /// message says which).
    #[error(transparent)]
    Tls(#[from] TransportError),
    /// Our certificate is not a coordinator certificate.
    #[error(
        "certificate names {0}, not a coordinator; issue one with `coordinatorctl pki issue --role coordinator`"
    )]
    WrongRole(protocol::Identity),
    /// Our certificate does not chain to the CA, or is not valid by this host's clock: every
    /// agent's certificate issued as recently would be refused too. Refused as `coordinator
    /// check` refuses it.
    #[error(transparent)]
    OwnCertificate(#[from] protocol::transport::ForeignCertificate),
    /// The database cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The registry failed.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// The inventory file is unusable.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// The inventory file gives a hostname that a machine in service holds at another
    /// address (one added with `coordinatorctl`, or retired by hand with a repair active).
    #[error(
        "inventory file {file}: hostname {hostname:?} is registered at {holder}, which the file does not list; the file cannot give it to {address} while that record holds it. Start with the file as it was, free the hostname (`coordinatorctl machines delete {holder}`, or `coordinatorctl machines add {holder} --hostname OTHER`), then restart with this file"
    )]
    InventoryHostnameTaken {
        /// The inventory file.
        file: std::path::PathBuf,
        /// The hostname.
        hostname: String,
        /// The address holding it.
        holder: String,
        /// The address the file gives it to.
        address: String,
    },
    /// The repair queue could not start.
    #[error(transparent)]
    Repair(#[from] crate::repair::RepairStartError),
    /// The `[kubernetes]` section is unusable (kubeconfig missing or invalid).
    #[error("kubernetes: {0}")]
    Kubernetes(crate::k8s::KubeError),
    /// A port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

impl AppError {
    /// True when the configuration (or a file it names) must be fixed: exit code 64.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            AppError::Tls(_)
                | AppError::WrongRole(_)
                | AppError::OwnCertificate(_)
                | AppError::Inventory(_)
                | AppError::InventoryHostnameTaken { .. }
                | AppError::Kubernetes(_)
        ) || matches!(self, AppError::Fleet(FleetError::Invalid(_)))
            || matches!(self, AppError::Repair(e) if e.is_config())
            || matches!(self, AppError::Fleet(FleetError::HostnameTaken { .. }))
            || matches!(self, AppError::Store(e) if e.is_config())
    }

    /// True when starting again later may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            AppError::Store(e) => e.is_retriable(),
            AppError::Fleet(e) => e.is_retriable(),
            AppError::Bind { .. } => true,
            _ => false,
        }
    }
}
