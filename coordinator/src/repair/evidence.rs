//! The evidence a repair step needs before it retries a power action whose outcome is
//! unknown: the machine's agent as last heard from, and how long to wait for it. Plain data
//! for the step decision (`decide`), which uses it; nothing here decides or acts.

use jiff::{SignedDuration, Timestamp};

/// How long a step whose power action's outcome is unknown waits for evidence that it did
/// not happen (the machine's agent reporting, after the outcome became unknown, the boot
/// id it had before the step) before it gives up on retrying: the step fails (and the
/// procedure escalates) instead of cycling the machine a second time on a guess.
///
/// 20 s: four report intervals of an agent at its default 5 s, and a reconnect; a machine
/// that was cycled sends nothing from its old boot after the cycle.
pub const UNKNOWN_EVIDENCE_WAIT: SignedDuration = SignedDuration::from_secs(20);

/// The machine's agent as last heard from, for a retry after an unknown outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSeen {
    /// The boot id of its last report.
    pub boot_id: String,
    /// When that report was received (coordinator clock).
    pub last_report: Timestamp,
}
