//! Power actions through rack BMC gateways.
//!
//! The repair queue and fencing use power only through the [`PowerControl`] trait. The real
//! implementation sends [`PowerRequest`]s to the bmc-gateway that serves the machine's rack,
//! over mutual-TLS QUIC; [`NoGateway`] answers "not available" when none is configured.

use futures::future::BoxFuture;
use protocol::gateway::{PowerRequest, PowerResponse};

/// Why a power request could not be carried to a gateway or answered.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// No gateway is configured for the machine.
    #[error("power control not available for {address}: {reason}")]
    NotAvailable {
        /// The machine.
        address: String,
        /// Why.
        reason: String,
    },
    /// The gateway could not be reached or did not answer in time.
    #[error("gateway {gateway} unreachable: {detail}")]
    Unreachable {
        /// The gateway.
        gateway: String,
        /// What happened.
        detail: String,
    },
}

impl PowerError {
    /// True when retrying later may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, PowerError::Unreachable { .. })
    }
}

/// Sends power requests to whatever gateway serves the machine.
pub trait PowerControl: Send + Sync + 'static {
    /// Carries out `req` (the gateway executes a given id at most once) and returns what the
    /// gateway answered.
    fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>>;
}

/// Used when no gateway is configured: every request fails with "not available".
#[derive(Debug, Default, Clone, Copy)]
pub struct NoGateway;

impl PowerControl for NoGateway {
    fn power(&self, req: PowerRequest) -> BoxFuture<'_, Result<PowerResponse, PowerError>> {
        Box::pin(async move {
            Err(PowerError::NotAvailable {
                address: req.address,
                reason: "no bmc-gateway is configured".into(),
            })
        })
    }
}
