//! The log lines of a commit's state changes.

use super::index::Entry;
use super::store::Write;
use crate::health::MachineState;

/// The state changes among a commit's writes (not a new machine's first state), logged
/// once the writes are stored: a change that cannot be stored (a full disk) is decided again
/// at the next sweep, and would otherwise be logged at every one.
pub(super) struct StateChanges(Vec<(String, String, MachineState, String)>);

impl StateChanges {
    /// The changes in `writes`.
    pub(super) fn of(writes: &[Write]) -> Self {
        Self(
            writes
                .iter()
                .filter_map(|w| match w {
                    Write::Transition {
                        address,
                        from,
                        to,
                        reason,
                        ..
                    } if !from.is_empty() => {
                        Some((address.clone(), from.clone(), *to, reason.clone()))
                    }
                    _ => None,
                })
                .collect(),
        )
    }

    /// Logs each change, with the hostname from `changed`.
    pub(super) fn log(self, changed: &[Entry]) {
        for (address, from, to, reason) in self.0 {
            let hostname = changed
                .iter()
                .find(|e| e.record.address == address)
                .map(|e| e.record.hostname.as_str())
                .unwrap_or_default();
            tracing::info!(
                machine = %address,
                hostname = %hostname,
                from = %from,
                to = %to,
                reason = %reason,
                "machine state changed"
            );
        }
    }
}
