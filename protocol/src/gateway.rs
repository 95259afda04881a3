//! Coordinator ↔ bmc-gateway messages: power actions on a rack's machines.
//!
//! The coordinator names a machine (address and serial); only the gateway knows its BMC and
//! credentials. Each request carries an id; the gateway executes a given id at most once and
//! answers a repeated id with the first result.

use serde::{Deserialize, Serialize};

/// What a coordinator says when it connects to a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorHello {
    /// The coordinator's name, for logs.
    pub coordinator: String,
}

/// A power action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerAction {
    /// Read the power state only.
    Status,
    /// Power on.
    On,
    /// Hard power off.
    Off,
    /// ACPI soft off.
    SoftOff,
    /// Power cycle (powers on a machine that is off).
    Cycle,
    /// Hard reset.
    Reset,
    /// Power off and confirm off by reading the power state.
    Fence,
}

/// A request to act on one machine's BMC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerRequest {
    /// Unique id; a repeated id is answered from the first execution's result.
    pub id: String,
    /// The machine's address.
    pub address: String,
    /// The machine's serial, checked against the gateway's configuration when not empty.
    pub serial: String,
    /// What to do.
    pub action: PowerAction,
    /// Overall time limit in milliseconds (0 = the gateway's default for the action).
    pub timeout_ms: u64,
}

/// A [`PowerRequest`] with the sender's fencing token: what a coordinator sends on a
/// connection whose hello spoke [`crate::fencing::FENCING_VERSION`] or later. postcard writes
/// a struct as its fields in order, so this is the request's encoding with the token after
/// it; on a version 1 connection the request travels alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedPowerRequest {
    /// The request.
    pub request: PowerRequest,
    /// Who sends it, in which epoch: a gateway that has seen a higher epoch of the same
    /// store refuses it before touching any BMC.
    pub token: crate::fencing::FencingToken,
}

/// Power state as read from a BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// The BMC did not say.
    Unknown,
}

/// The answer to a [`PowerRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerResponse {
    /// The request's id.
    pub id: String,
    /// What happened.
    pub outcome: PowerOutcome,
}

/// How the detail of a [`PowerOutcome::Failed`] begins when the gateway restarted while the
/// request ran: whether it reached the BMC is unknown, and the id is not executed again.
pub const OUTCOME_UNKNOWN: &str = "outcome unknown: ";

/// How the detail of a [`PowerOutcome::Done`] of a cycle begins when the machine read off
/// before it, so the gateway powered it on and did not cycle it: the machine was off, or
/// another request was cycling it (the detail names that request).
pub const POWERED_ON_ONLY: &str = "powered on only: ";

impl PowerOutcome {
    /// True for a cycle that found the machine off and only powered it on
    /// ([`POWERED_ON_ONLY`]).
    pub fn is_powered_on_only(&self) -> bool {
        matches!(self, PowerOutcome::Done { detail, .. } if detail.starts_with(POWERED_ON_ONLY))
    }

    /// True for a refusal because a newer coordinator of the same store has spoken to the
    /// gateway ([`crate::fencing::refusal`]): final, never retried.
    pub fn is_refused_epoch(&self) -> bool {
        matches!(self, PowerOutcome::Failed { detail, .. } if crate::fencing::is_refused_epoch(detail))
    }

    /// True for the answer to an id the gateway was running when it restarted
    /// ([`OUTCOME_UNKNOWN`]): acting again needs a new id.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, PowerOutcome::Failed { detail, .. } if detail.starts_with(OUTCOME_UNKNOWN))
    }
}

impl PowerAction {
    /// True when doing the action twice leaves the machine as doing it once: power off,
    /// power on and a fence (off, confirmed). A cycle or a status read is not (a second
    /// cycle reboots again).
    pub fn is_idempotent(self) -> bool {
        matches!(
            self,
            PowerAction::Off | PowerAction::On | PowerAction::Fence
        )
    }
}

/// The result of a power action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PowerOutcome {
    /// The action was carried out.
    Done {
        /// Power state read after the action, if it was read.
        state: PowerState,
        /// For a fence: when power was confirmed off (Unix ms).
        confirmed_off_unix_ms: Option<u64>,
        /// What the BMC said, for a person.
        detail: String,
    },
    /// The action failed; nothing more is known than `detail` says.
    Failed {
        /// What was attempted and what was seen.
        detail: String,
        /// True when retrying later may succeed (timeouts, BMC busy).
        retriable: bool,
    },
}

/// The first bytes of a [`ServedQuery`]'s frame: postcard's encoding of a one-byte string
/// whose byte is not UTF-8. A [`PowerRequest`] begins with its id, a string, so no power
/// request begins so: a gateway of this release tells the two apart by these bytes, and one
/// from before the query fails to read it as a power request and resets the stream, which
/// the asker reports as a gateway too old to answer (nothing is acted on either way).
pub const SERVED_QUERY_MAGIC: [u8; 2] = [0x01, 0xFF];

/// "Which machines do you serve?", on a stream of its own where a [`PowerRequest`] would
/// be: asked by `coordinator check`, answered with [`ServedMachines`]. No BMC is touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedQuery {
    /// Always [`SERVED_QUERY_MAGIC`].
    pub magic: [u8; 2],
}

impl Default for ServedQuery {
    fn default() -> Self {
        Self {
            magic: SERVED_QUERY_MAGIC,
        }
    }
}

impl ServedQuery {
    /// Whether a frame's payload is a [`ServedQuery`] rather than a [`PowerRequest`].
    pub fn is_query(payload: &[u8]) -> bool {
        payload.starts_with(&SERVED_QUERY_MAGIC)
    }
}

/// The answer to a [`ServedQuery`]: the machines (addresses, as the coordinator names them)
/// the gateway has a `[[bmc]]` table for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedMachines {
    /// Machine addresses, sorted.
    pub machines: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_query_is_never_read_as_a_power_request() {
        let q = postcard::to_allocvec(&ServedQuery::default()).unwrap();
        assert!(ServedQuery::is_query(&q));
        // What a gateway from before the query does with it: fail to read a power request.
        assert!(postcard::from_bytes::<PowerRequest>(&q).is_err());
        // And no power request looks like one, whatever its id.
        for id in ["", "a", "\u{ff}", "00000000-0000-0000-0000-000000000000"] {
            let r = PowerRequest {
                id: id.into(),
                address: "10.0.0.1".into(),
                serial: String::new(),
                action: PowerAction::Status,
                timeout_ms: 0,
            };
            assert!(
                !ServedQuery::is_query(&postcard::to_allocvec(&r).unwrap()),
                "{id:?}"
            );
        }
    }
}
