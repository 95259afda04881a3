//! The inventory file at a start: the file is the source of truth for its machines
//! ([`import_inventory`]); `coordinator check` reports what it would do on a copy of the store.

use crate::fleet::{Fleet, FleetError};
use crate::inventory::{MachineRecord, RecordSource, load_inventory};
use crate::repair::store::RepairQueueStore;
use crate::store::Store;

use super::AppError;

/// What importing the inventory file at a start did (or, on a copy of the store, would do:
/// `coordinator check`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InventoryImport {
    /// Listed machines the store did not know.
    pub new: Vec<String>,
    /// Machines the file no longer lists: retired and released to the operator.
    pub released: Vec<String>,
    /// Hostnames the file gives to another address: (hostname, old address, new address);
    /// the retired record at the old address is deleted (its history stays).
    pub moved: Vec<(String, String, String)>,
    /// Listed machines left out of this start: their hostname is held by a machine with an
    /// active repair.
    pub deferred: Vec<String>,
    /// The records the file lists, as read.
    pub records: Vec<MachineRecord>,
}

/// Imports the inventory file at `path` into `fleet`: the file is the source of truth for
/// its machines. One it dropped is retired and released to the operator, and gives up its
/// hostname to the address the file now gives it to, unless a repair of it is under way.
pub async fn import_inventory(
    fleet: &Fleet,
    store: &Store,
    path: &std::path::Path,
) -> Result<InventoryImport, AppError> {
    let records = load_inventory(path, RecordSource::Inventory)?;
    let busy = store.active_addresses().await?;
    let hostnames: std::collections::HashMap<String, String> = fleet
        .list()
        .into_iter()
        .map(|m| (m.spec.address, m.spec.hostname))
        .collect();
    let released = fleet.release_unlisted(&records, path, &busy).await?;
    let moved = released
        .moved
        .iter()
        .filter_map(|old| {
            let hostname = hostnames.get(old)?;
            let new = records.iter().find(|r| &r.hostname == hostname)?;
            Some((hostname.clone(), old.clone(), new.address.clone()))
        })
        .collect();
    let records: Vec<_> = records
        .into_iter()
        .filter(|r| !released.deferred.contains(&r.address))
        .collect();
    let new = records
        .iter()
        .filter(|r| fleet.machine(&r.address).is_none())
        .map(|r| r.address.clone())
        .collect();
    let by_hostname: std::collections::HashMap<String, String> = records
        .iter()
        .map(|r| (r.hostname.clone(), r.address.clone()))
        .collect();
    fleet.upsert(records.clone()).await.map_err(|e| match e {
        FleetError::HostnameTaken { hostname, address } => AppError::InventoryHostnameTaken {
            file: path.to_path_buf(),
            address: by_hostname.get(&hostname).cloned().unwrap_or_default(),
            hostname,
            holder: address,
        },
        e => AppError::Fleet(e),
    })?;
    Ok(InventoryImport {
        new,
        released: released
            .released
            .into_iter()
            .filter(|a| !released.moved.contains(a))
            .collect(),
        moved,
        deferred: released.deferred,
        records,
    })
}
