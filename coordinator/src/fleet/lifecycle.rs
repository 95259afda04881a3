//! A machine's life as an operator steers it: delete, the admin states (`updating`,
//! `retiring`, `retired`) and handing a machine back to health derivation, and what
//! happens to machines the inventory file no longer lists.
//!
//! Which source wins: the inventory file is the source of truth for the machines it lists.
//! An admin edit of such a machine's record (`machines add/import/delete`) is refused,
//! naming the file as the place to change it; a machine that was in the file and is not any
//! more is retired at start, never silently kept or dropped (its history stays). Admin
//! *states* are not record edits: an operator may put an inventory machine into
//! maintenance (`updating`) or retire it. Whether a repair is active is the repair queue's
//! business, checked by the admin handler before [`Fleet::delete`] is called.

use protocol::admin::machines::MachineSummary;

use super::index::Entry;
use super::sql::Write;
use super::{Fleet, FleetError};
use crate::health::MachineState;
use crate::inventory::RecordSource;

/// The states an operator may set with `machines set-state`.
pub const SETTABLE: &[MachineState] = &[
    MachineState::Updating,
    MachineState::Retiring,
    MachineState::Retired,
];

impl Fleet {
    /// Refuses an admin change to the record of a machine the inventory file lists.
    pub(super) fn refuse_inventory_edit(e: &Entry, what: &str) -> Result<(), FleetError> {
        if e.record.source == RecordSource::Inventory {
            return Err(FleetError::InventoryOwned {
                address: e.record.address.clone(),
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// Removes a machine's record (its transition history stays). Refused for a machine
    /// the inventory file lists.
    pub async fn delete(&self, address: &str) -> Result<(), FleetError> {
        let _gate = self.gate.lock().await;
        {
            let inner = self.lock();
            let e = inner
                .machines
                .get(address)
                .ok_or_else(|| FleetError::UnknownMachine(address.to_string()))?;
            Self::refuse_inventory_edit(e, "deleted")?;
        }
        self.commit(
            vec![Write::Delete(address.to_string())],
            Vec::new(),
            vec![address.to_string()],
        )
        .await?;
        tracing::info!(machine = %address, "machine deleted");
        Ok(())
    }

    /// Puts a machine into an admin state (`Some`), which reports never change, or hands
    /// it back to health derivation (`None`, from `uninitialized` so the next report or the
    /// sweep decides). Returns the machine's summary after the change.
    pub async fn set_admin_state(
        &self,
        address: &str,
        state: Option<MachineState>,
        reason: &str,
    ) -> Result<MachineSummary, FleetError> {
        if let Some(s) = state
            && !s.is_admin()
        {
            return Err(FleetError::NotAdminState(s.as_str().to_string()));
        }
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut e = self
            .lock()
            .machines
            .get(address)
            .cloned()
            .ok_or_else(|| FleetError::UnknownMachine(address.to_string()))?;
        let target = state.unwrap_or(MachineState::Uninitialized);
        let mut writes = Vec::new();
        if e.state != target {
            Self::transition(
                &mut e,
                crate::health::Derived {
                    state: target,
                    reason: reason.to_string(),
                },
                now,
                &mut writes,
            );
        }
        if state.is_none()
            && let Some(d) = self.evaluate(&e, now)
        {
            Self::transition(&mut e, d, now, &mut writes);
        }
        let summary = self.summary(&e);
        self.commit(writes, vec![e], Vec::new()).await?;
        Ok(summary)
    }

    /// Retires every machine that came from the inventory file but is not in `listed` any
    /// more (called after loading the file at start). Returns their addresses.
    pub async fn retire_unlisted(
        &self,
        listed: &[String],
        file: &std::path::Path,
    ) -> Result<Vec<String>, FleetError> {
        let unlisted: Vec<String> = self
            .lock()
            .machines
            .values()
            .filter(|e| {
                e.record.source == RecordSource::Inventory
                    && e.state != MachineState::Retired
                    && !listed.contains(&e.record.address)
            })
            .map(|e| e.record.address.clone())
            .collect();
        for a in &unlisted {
            let reason = format!("no longer listed in the inventory file {}", file.display());
            self.set_admin_state(a, Some(MachineState::Retired), &reason)
                .await?;
            tracing::warn!(machine = %a, file = %file.display(), "machine removed from the inventory file: retired");
        }
        Ok(unlisted)
    }
}
