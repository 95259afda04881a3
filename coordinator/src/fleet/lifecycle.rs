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
use super::store::Write;
use super::{Fleet, FleetError};
use crate::health::MachineState;
use crate::inventory::RecordSource;

/// The states an operator may set with `machines set-state`.
pub const SETTABLE: &[MachineState] = &[
    MachineState::Updating,
    MachineState::Retiring,
    MachineState::Retired,
];

/// What [`Fleet::release_unlisted`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Machines the file no longer lists: retired, and now the operator's records.
    pub released: Vec<String>,
    /// Retired records deleted because the file gives their hostname to another address.
    pub moved: Vec<String>,
    /// Addresses of file records to leave out of this start: their hostname is held by a
    /// machine with an active repair.
    pub deferred: Vec<String>,
}

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

    /// Releases every machine that came from the inventory file but is not in `listed` any
    /// more (called after loading the file at start, before [`Fleet::upsert`] of its
    /// records): it is retired, and its record becomes an ordinary one that `machines
    /// delete` and `machines add` may change, since the file no longer speaks for it. A
    /// released machine (or one retired by hand) whose hostname the file now gives to
    /// another address is deleted, its history kept, so a hostname moves to a new address
    /// with one edit of the file. Unless the old machine has an active repair (`busy`): its
    /// record stays until the repair ends, and the file's record for the new address is
    /// left out of this start (`deferred`, logged as an error) rather than stopping the
    /// coordinator, which would stop that repair too.
    pub async fn release_unlisted(
        &self,
        listed: &[crate::inventory::MachineRecord],
        file: &std::path::Path,
        busy: &std::collections::HashSet<String>,
    ) -> Result<Released, FleetError> {
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut writes = Vec::new();
        let mut changed = Vec::new();
        let mut released = Vec::new();
        let mut moved = Vec::new();
        let mut deferred = Vec::new();
        {
            let inner = self.lock();
            // A set: a fleet's file lists thousands, and this runs at every start.
            let addresses: std::collections::HashSet<&str> =
                listed.iter().map(|r| r.address.as_str()).collect();
            let in_file = |a: &str| addresses.contains(a);
            for e in inner.machines.values() {
                if e.record.source != RecordSource::Inventory || in_file(&e.record.address) {
                    continue;
                }
                let mut e = e.clone();
                e.record.source = RecordSource::Admin;
                if e.state == MachineState::Retired {
                    writes.push(Write::Row(super::index::row(&e, now)));
                } else {
                    let reason =
                        format!("no longer listed in the inventory file {}", file.display());
                    Self::transition(
                        &mut e,
                        crate::health::Derived {
                            state: MachineState::Retired,
                            reason,
                        },
                        now,
                        &mut writes,
                    );
                }
                tracing::warn!(
                    machine = %e.record.address,
                    file = %file.display(),
                    "machine removed from the inventory file: retired; `coordinatorctl machines delete` removes its record"
                );
                released.push(e.record.address.clone());
                changed.push(e);
            }
            for rec in listed {
                let Some(holder) = inner.by_hostname.get(&rec.hostname) else {
                    continue;
                };
                if *holder == rec.address || in_file(holder) {
                    continue;
                }
                let retired = changed
                    .iter()
                    .find(|e| e.record.address == *holder)
                    .or_else(|| inner.machines.get(holder))
                    .is_some_and(|e| e.state == MachineState::Retired);
                if !retired {
                    continue;
                }
                if busy.contains(holder) {
                    tracing::error!(
                        hostname = %rec.hostname,
                        from = %holder,
                        to = %rec.address,
                        "hostname moved to another address in the inventory file, but the old address has an active repair: the new address is not registered until a start after that repair ends (`coordinatorctl repair-queue list`)"
                    );
                    deferred.push(rec.address.clone());
                    continue;
                }
                tracing::warn!(
                    hostname = %rec.hostname,
                    from = %holder,
                    to = %rec.address,
                    "hostname moved to another address in the inventory file: the retired record at the old address is deleted (its history stays)"
                );
                changed.retain(|e| e.record.address != *holder);
                writes.push(Write::Delete(holder.clone()));
                moved.push(holder.clone());
            }
        }
        self.commit(writes, changed, moved.clone()).await?;
        Ok(Released {
            released,
            moved,
            deferred,
        })
    }
}
