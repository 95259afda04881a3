//! What other areas read of the registry, in domain types (not the admin API's wire
//! types): one machine's record and state ([`MachineView`]), its live health
//! ([`LiveHealth`]), and a snapshot of the whole fleet ([`FleetSnapshot`]), which is what
//! detectors read.
//!
//! Plain data: building them is the registry's job ([`super::Fleet`]), under one lock.

use std::collections::BTreeMap;

use jiff::Timestamp;
use protocol::messages::GoodbyeReason;

use crate::health::MachineState;
use crate::inventory::MachineRecord;

/// A machine's record and state, for other areas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    /// Registered attributes.
    pub record: MachineRecord,
    /// State.
    pub state: MachineState,
    /// When it was entered.
    pub since: Timestamp,
    /// Why.
    pub reason: String,
}

/// Live health of a machine (memory only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveHealth {
    /// When the last report was received (coordinator clock).
    pub last_report_at: Option<Timestamp>,
    /// The boot id last seen in a hello or report.
    pub boot_id: Option<String>,
    /// Start of the current unbroken run of reports with no failing check; `None` when the
    /// last report had a failing check, after a goodbye or reboot, or before any report.
    pub healthy_since: Option<Timestamp>,
    /// Whether an agent connection is open.
    pub connected: bool,
    /// The last goodbye, if no report came after it.
    pub goodbye: Option<(GoodbyeReason, Timestamp)>,
}

/// One machine in a [`FleetSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSnapshot {
    /// Registered attributes: address, hostname, serial, rack, role, machine type, labels.
    pub record: MachineRecord,
    /// State.
    pub state: MachineState,
    /// When the state was entered.
    pub since: Timestamp,
    /// Why the state was entered.
    pub reason: String,
    /// When the last report was received (coordinator clock).
    pub last_report_at: Option<Timestamp>,
    /// The boot id last seen in a hello or report.
    pub boot_id: Option<String>,
    /// When that boot id was first seen (coordinator clock): the boot's start as far as
    /// the coordinator knows.
    pub boot_seen_at: Option<Timestamp>,
    /// The last silence that ended (the machine was unreachable without a goodbye): the
    /// last report before it and the first after it.
    pub last_silence: Option<(Timestamp, Timestamp)>,
    /// The last report says the crash kernel is loaded (kdump check ok).
    pub kdump_loaded: bool,
    /// Checks failing in the last report, with when each began failing.
    pub failing: BTreeMap<String, Timestamp>,
    /// For each kind of check failing in the last report, since when some check of that
    /// kind has failed in every report (see `failing_kinds_since` in the registry).
    pub failing_kinds: BTreeMap<String, Timestamp>,
    /// The last goodbye and when, if no report came after it.
    pub goodbye: Option<(GoodbyeReason, Timestamp)>,
    /// Whether an agent connection is open.
    pub connected: bool,
}

/// Every machine with its state and live health, as of one instant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetSnapshot {
    /// When the snapshot was taken (coordinator clock).
    pub taken_at: Option<Timestamp>,
    /// Machines, ordered by address.
    pub machines: Vec<MachineSnapshot>,
}

impl FleetSnapshot {
    /// The machine at `address`.
    pub fn machine(&self, address: &str) -> Option<&MachineSnapshot> {
        self.machines
            .binary_search_by(|m| m.record.address.as_str().cmp(address))
            .ok()
            .map(|i| &self.machines[i])
    }
}
