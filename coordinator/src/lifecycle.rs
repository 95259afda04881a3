//! Admin requests that cross the inventory and the repair queue: `machines delete` (which
//! must know whether a repair is active), `machines set-state`, and `repair-queue add`
//! checked against the inventory.
//!
//! The rules for whose word wins between the inventory file and admin edits live in
//! [`crate::fleet::lifecycle`]; the pure check of a repair entry against a machine record
//! is [`check_entry`]. This module only sequences the calls.

use protocol::admin::AdminResponse;
use protocol::admin::machines::MachinesResponse;
use protocol::admin::repair::{
    AddRepairEntry, RepairQueueRequest, RepairQueueResponse, RepairStatus,
};
use protocol::messages::{Refusal, RefusalCode};

use crate::admin::Admin;
use crate::fleet::FleetError;
use crate::fleet::MachineView;
use crate::health::MachineState;

fn refuse(reason: impl Into<String>) -> AdminResponse {
    AdminResponse::Error(Refusal::new(RefusalCode::BadRequest, reason))
}

/// Why a repair entry does not fit the inventory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryCheckError {
    /// No machine has the address.
    #[error(
        "no machine with address {0} in the inventory: check the address (`coordinatorctl machines list`), or pass --force to queue it anyway"
    )]
    UnknownAddress(String),
    /// The serial given is not the machine's.
    #[error(
        "serial {given:?} contradicts the inventory: machine {address} has serial {recorded:?}"
    )]
    SerialMismatch {
        /// The machine.
        address: String,
        /// Serial typed.
        given: String,
        /// Serial in the inventory.
        recorded: String,
    },
    /// The machine type given is not the machine's: it would run another hardware type's
    /// repair procedure on it.
    #[error(
        "machine type {given:?} contradicts the inventory: machine {address} has type {recorded:?}, and {given:?} would run another type's repair procedure on it; give {recorded:?} or leave MACHINE_TYPE out (or fix the machine's record: `coordinatorctl machines add`, or the inventory file)"
    )]
    TypeMismatch {
        /// The machine.
        address: String,
        /// Type typed.
        given: String,
        /// Type in the inventory.
        recorded: String,
    },
    /// No type was given and none is known.
    #[error("no machine type given for {0} and the inventory has none: give MACHINE_TYPE")]
    NoType(String),
    /// The machine is retired or being retired: never repaired.
    #[error(
        "machine {address} is {state}: retired machines are never repaired (pass --force to queue it anyway)"
    )]
    Retired {
        /// The machine.
        address: String,
        /// Its state.
        state: MachineState,
    },
}

/// Checks `entry` against the machine at its address and fills an empty serial and machine
/// type from the record. `force` lets an unknown or retired address through (with what was
/// typed); contradictions (a serial or a machine type that is not the record's) are refused
/// even then: the procedure a type selects is written for that hardware.
pub fn check_entry(
    mut entry: AddRepairEntry,
    machine: Option<&MachineView>,
    force: bool,
) -> Result<AddRepairEntry, EntryCheckError> {
    let Some(m) = machine else {
        if !force {
            return Err(EntryCheckError::UnknownAddress(entry.address));
        }
        if entry.machine_type.is_empty() {
            return Err(EntryCheckError::NoType(entry.address));
        }
        return Ok(entry);
    };
    if matches!(m.state, MachineState::Retired | MachineState::Retiring) && !force {
        return Err(EntryCheckError::Retired {
            address: entry.address,
            state: m.state,
        });
    }
    let recorded_serial = &m.record.serial;
    if entry.serial.is_empty() {
        entry.serial = recorded_serial.clone();
    } else if !recorded_serial.is_empty() && entry.serial != *recorded_serial {
        return Err(EntryCheckError::SerialMismatch {
            address: entry.address,
            given: entry.serial,
            recorded: recorded_serial.clone(),
        });
    }
    // CKE users name the type (its positional form): the record's is accepted, another is
    // refused. A machine awaiting registration has none yet, so what was typed is kept.
    match (&m.record.machine_type, entry.machine_type.is_empty()) {
        (Some(t), true) => entry.machine_type = t.clone(),
        (None, true) => return Err(EntryCheckError::NoType(entry.address)),
        (Some(t), false) if entry.machine_type != *t => {
            return Err(EntryCheckError::TypeMismatch {
                address: entry.address,
                given: entry.machine_type,
                recorded: t.clone(),
            });
        }
        (_, false) => {}
    }
    Ok(entry)
}

impl Admin {
    /// Turns `AddChecked` into a plain `Add` of the checked, filled entry; other requests
    /// pass unchanged. An entry that does not fit is answered with the refusal.
    pub(crate) fn check_repair_request(
        &self,
        req: RepairQueueRequest,
    ) -> Result<RepairQueueRequest, Refusal> {
        let RepairQueueRequest::AddChecked { mut entry, force } = req else {
            return Ok(req);
        };
        // CKE's entries name a machine by IP address; a hostname here (even with --force,
        // which would queue an entry no machine ever matches) is refused, with the address
        // when a machine has that hostname.
        if let Ok(ip) = entry.address.parse::<std::net::IpAddr>() {
            // The inventory's form (`::0001` is `::1`), so the entry finds its machine.
            entry.address = ip.to_canonical().to_string();
        } else {
            let hint = self
                .fleet
                .machine_by_hostname(&entry.address)
                .map(|m| {
                    format!(
                        "; {} is the hostname of {}: queue the entry for {}",
                        entry.address, m.record.address, m.record.address
                    )
                })
                .unwrap_or_default();
            return Err(Refusal::new(
                RefusalCode::BadRequest,
                format!(
                    "`{}` is not an IP address; the repair queue is keyed by machine address{hint}",
                    entry.address
                ),
            ));
        }
        let machine = self.fleet.machine(&entry.address);
        if machine.is_none() && force {
            tracing::warn!(machine = %entry.address, "repair queued with --force for an address the inventory does not know");
        }
        check_entry(entry, machine.as_ref(), force)
            .map(RepairQueueRequest::Add)
            .map_err(|e| Refusal::new(RefusalCode::BadRequest, e.to_string()))
    }

    /// Repair entries of `address` that are queued or processing.
    async fn active_repairs(&self, address: &str) -> Result<Vec<u64>, Refusal> {
        let Some(q) = &self.repair else {
            return Ok(Vec::new());
        };
        match q
            .handle_admin(
                RepairQueueRequest::List,
                crate::repair::Requester::coordinator(),
            )
            .await
        {
            AdminResponse::RepairQueue(RepairQueueResponse::List(list)) => Ok(list
                .iter()
                .filter(|e| {
                    e.address == address
                        && !e.deleted
                        && matches!(e.status, RepairStatus::Queued | RepairStatus::Processing)
                })
                .map(|e| e.index)
                .collect()),
            AdminResponse::Error(r) => Err(r),
            other => Err(Refusal::new(
                RefusalCode::Internal,
                format!("unexpected repair queue answer: {other:?}"),
            )),
        }
    }

    /// `machines delete`: refused while a repair is active unless `force`, which marks the
    /// active entries for deletion (cancelling a running one) first.
    pub(crate) async fn delete_machine(
        &self,
        who: &str,
        address: String,
        force: bool,
    ) -> AdminResponse {
        if self.fleet.machine(&address).is_none() {
            return fleet_refusal(FleetError::UnknownMachine(address));
        }
        let active = match self.active_repairs(&address).await {
            Ok(a) => a,
            Err(r) => return AdminResponse::Error(r),
        };
        if !active.is_empty() && !force {
            return refuse(format!(
                "machine {address} has an active repair (entries {}): wait for it, or pass --force to cancel it and delete the machine",
                join(&active)
            ));
        }
        if let Some(q) = &self.repair {
            for index in &active {
                if let AdminResponse::Error(r) = q
                    .handle_admin(
                        RepairQueueRequest::Delete { index: *index },
                        crate::repair::Requester::admin(&format!("{who}, machines delete --force")),
                    )
                    .await
                {
                    return AdminResponse::Error(r);
                }
            }
        }
        if let Err(e) = self.fleet.delete(&address).await {
            return fleet_refusal(e);
        }
        // Its agent, if connected, would go on reporting about a machine we no longer have;
        // closed, it reconnects and its hello registers it as awaiting registration.
        let connected = self.links.close_deleted(&address);
        tracing::info!(admin = %who, machine = %address, cancelled = %join(&active), agent_connected = connected, "machine deleted");
        AdminResponse::Machines(MachinesResponse::Deleted {
            address,
            cancelled_repairs: active,
        })
    }

    /// `machines set-state` (and `retire`/`unretire`).
    pub(crate) async fn set_machine_state(
        &self,
        who: &str,
        address: String,
        state: String,
    ) -> AdminResponse {
        let target = if state == "auto" {
            None
        } else {
            match state.parse::<MachineState>() {
                Ok(s) => Some(s),
                Err(_) => return fleet_refusal(FleetError::NotAdminState(state)),
            }
        };
        let reason = match target {
            Some(s) => format!("set to {s} by admin {who}"),
            None => format!("handed back to health checks by admin {who}"),
        };
        match self.fleet.set_admin_state(&address, target, &reason).await {
            Ok(s) => {
                tracing::info!(admin = %who, machine = %address, state = %s.state, "machine state set");
                AdminResponse::Machines(MachinesResponse::StateSet(Box::new(s)))
            }
            Err(e) => fleet_refusal(e),
        }
    }
}

fn fleet_refusal(e: FleetError) -> AdminResponse {
    let code = match e {
        FleetError::Store(_) => RefusalCode::Internal,
        _ => RefusalCode::BadRequest,
    };
    AdminResponse::Error(Refusal::new(code, e.to_string()))
}

fn join(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{MachineRecord, RecordSource};

    fn entry(t: &str, serial: &str) -> AddRepairEntry {
        AddRepairEntry {
            operation: "op".into(),
            machine_type: t.into(),
            address: "10.0.0.1".into(),
            serial: serial.into(),
        }
    }

    fn machine(state: MachineState) -> MachineView {
        MachineView {
            record: MachineRecord {
                address: "10.0.0.1".into(),
                hostname: "n1".into(),
                serial: "S1".into(),
                rack: String::new(),
                role: String::new(),
                machine_type: Some("worker".into()),
                labels: Default::default(),
                source: RecordSource::Inventory,
            },
            state,
            since: jiff::Timestamp::UNIX_EPOCH,
            reason: String::new(),
        }
    }

    #[test]
    fn unknown_addresses_need_force() {
        assert_eq!(
            check_entry(entry("worker", ""), None, false),
            Err(EntryCheckError::UnknownAddress("10.0.0.1".into()))
        );
        assert!(check_entry(entry("worker", ""), None, true).is_ok());
        assert!(check_entry(entry("", ""), None, true).is_err());
    }

    #[test]
    fn missing_serial_and_type_are_filled_from_the_inventory() {
        let m = machine(MachineState::Healthy);
        let e = check_entry(entry("", ""), Some(&m), false).unwrap();
        assert_eq!(e.serial, "S1");
        assert_eq!(e.machine_type, "worker");
    }

    #[test]
    fn a_contradicting_serial_is_refused_even_with_force() {
        let m = machine(MachineState::Healthy);
        assert!(matches!(
            check_entry(entry("worker", "OTHER"), Some(&m), true),
            Err(EntryCheckError::SerialMismatch { .. })
        ));
    }

    #[test]
    fn a_contradicting_machine_type_is_refused_even_with_force() {
        let m = machine(MachineState::Healthy);
        for force in [false, true] {
            let e = check_entry(entry("storage", "S1"), Some(&m), force).unwrap_err();
            assert_eq!(
                e,
                EntryCheckError::TypeMismatch {
                    address: "10.0.0.1".into(),
                    given: "storage".into(),
                    recorded: "worker".into(),
                }
            );
            assert!(
                e.to_string()
                    .starts_with("machine type \"storage\" contradicts the inventory"),
                "{e}"
            );
        }
        // Retired with --force: still the record's type or none.
        let retired = machine(MachineState::Retired);
        assert!(matches!(
            check_entry(entry("storage", ""), Some(&retired), true),
            Err(EntryCheckError::TypeMismatch { .. })
        ));
        // The record's own type, as CKE's positional form gives it, is accepted.
        let e = check_entry(entry("worker", "S1"), Some(&m), false).unwrap();
        assert_eq!(e.machine_type, "worker");
        // A machine awaiting registration has no type to contradict.
        let mut unregistered = machine(MachineState::AwaitingRegistration);
        unregistered.record.machine_type = None;
        let e = check_entry(entry("storage", ""), Some(&unregistered), false).unwrap();
        assert_eq!(e.machine_type, "storage");
    }

    #[test]
    fn retired_machines_are_not_repaired_without_force() {
        let m = machine(MachineState::Retired);
        assert!(matches!(
            check_entry(entry("worker", ""), Some(&m), false),
            Err(EntryCheckError::Retired { .. })
        ));
        assert!(check_entry(entry("worker", ""), Some(&m), true).is_ok());
    }
}
