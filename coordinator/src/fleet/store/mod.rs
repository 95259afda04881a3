//! Machine records and their state history as state: [`MachineStore`], with one
//! implementation per backend ([`sqlite`] here).
//!
//! The registry ([`super::Fleet`]) holds every machine in memory and writes a state
//! transition (the machine's row and a history line, one transaction) *before* it becomes
//! visible, so nothing reported as done is lost in a crash. Heartbeats and reports never
//! write.

use std::future::Future;

use jiff::Timestamp;
use protocol::admin::machines::StateTransition;

use crate::health::MachineState;
use crate::inventory::MachineRecord;
use crate::store::{Store, StoreError, dispatch};

pub(crate) mod etcd;
pub(crate) mod sqlite;

/// A machine as stored: its record and last state.
#[derive(Debug)]
pub(crate) struct StoredMachine {
    pub(crate) record: MachineRecord,
    pub(crate) state: MachineState,
    pub(crate) since: Timestamp,
    pub(crate) reason: String,
    /// The boot id its agent last reported, to this run or an earlier one.
    pub(crate) boot_id: Option<String>,
    /// Its stored history has a report's state (healthy or unhealthy): its agent reported
    /// at some time, perhaps before this coordinator started.
    pub(crate) reported: bool,
}

/// One database write, applied with others in one transaction.
#[derive(Debug)]
pub(crate) enum Write {
    Row(Row),
    Delete(String),
    Transition {
        address: String,
        from: String,
        to: MachineState,
        at: Timestamp,
        reason: String,
    },
    /// The machine's agent reported another boot id than the stored one.
    Boot {
        address: String,
        boot_id: String,
    },
}

/// A machine's row.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) record: MachineRecord,
    pub(crate) state: MachineState,
    pub(crate) since: Timestamp,
    pub(crate) reason: String,
    /// When it is written (`updated_ms`, and `created_ms` of a new row).
    pub(crate) now: Timestamp,
}

/// Transitions kept per machine: its newest ones. Without a bound the table would grow for
/// as long as the coordinator runs, fastest for a flapping machine (two rows per flap, every
/// few reports); `machines show` prints the newest [`crate::fleet::SHOW_TRANSITIONS`].
pub(crate) const KEEP_TRANSITIONS: i64 = 500;

/// What the machine registry needs of a store.
///
/// The registry is the only writer of machines (its writes are serialised by one gate) and
/// decides from its own copy; each [`persist`](Self::persist) is one transaction, so a
/// backend shared by several coordinators can make it one conditional write.
pub(crate) trait MachineStore {
    /// Every stored machine, ordered by address.
    fn machines(&self) -> impl Future<Output = Result<Vec<StoredMachine>, StoreError>> + Send;

    /// Applies `writes` in order, all or nothing. A machine keeps its newest
    /// [`KEEP_TRANSITIONS`] transitions.
    fn persist(&self, writes: Vec<Write>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Transitions of a machine, most recent first, at most `limit`.
    fn transitions(
        &self,
        address: String,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<StateTransition>, StoreError>> + Send;
}

impl MachineStore for Store {
    async fn machines(&self) -> Result<Vec<StoredMachine>, StoreError> {
        dispatch!(self, b => b.machines().await)
    }

    async fn persist(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        dispatch!(self, b => b.persist(writes).await)
    }

    async fn transitions(
        &self,
        address: String,
        limit: i64,
    ) -> Result<Vec<StateTransition>, StoreError> {
        dispatch!(self, b => b.transitions(address, limit).await)
    }
}

/// For benchmarks across backends (`tests/tests/etcd_bench.rs`): fills a store with machine
/// records and reads them back as a starting coordinator does.
#[cfg(any(test, feature = "testing"))]
pub mod bench {
    use super::*;

    /// Writes `n` healthy machines in batches of 1,000 (as an inventory import does).
    pub async fn fill(s: &Store, n: usize) -> Result<(), StoreError> {
        let now = jiff::Timestamp::now();
        let row = |i: usize| {
            Write::Row(Row {
                record: MachineRecord {
                    address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                    hostname: format!("n{i}"),
                    serial: format!("SN{i}"),
                    rack: format!("rack-{}", i / 40),
                    role: "worker".into(),
                    machine_type: Some("qemu".into()),
                    labels: Default::default(),
                    source: crate::inventory::RecordSource::Inventory,
                },
                state: MachineState::Healthy,
                since: now,
                reason: String::new(),
                now,
            })
        };
        for from in (0..n).step_by(1000) {
            s.persist((from..n.min(from + 1000)).map(row).collect())
                .await?;
        }
        Ok(())
    }

    /// Reads every machine, as a starting coordinator does; how many.
    pub async fn read_all(s: &Store) -> Result<usize, StoreError> {
        Ok(s.machines().await?.len())
    }
}

/// The store tests every backend must pass for machines, each on a new, empty store.
/// They take a [`Store`]: the machine types are the registry's own.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;
    use crate::clock::from_unix_ms;
    use crate::inventory::RecordSource;

    fn transition(address: &str, i: i64) -> Write {
        Write::Transition {
            address: address.into(),
            from: "healthy".into(),
            to: MachineState::Unreachable,
            at: from_unix_ms(1_800_000_000_000 + i),
            reason: format!("flap {i}"),
        }
    }

    /// A machine round-trips with its state, boot id and whether it ever reported; a
    /// deleted one is gone.
    pub async fn machines_round_trip(s: &Store) {
        let at = from_unix_ms(1_800_000_000_000);
        let record = MachineRecord {
            address: "10.0.0.1".into(),
            hostname: "n1".into(),
            serial: "S1".into(),
            rack: "r1".into(),
            role: "worker".into(),
            machine_type: Some("qemu".into()),
            labels: [("zone".to_string(), "a".to_string())].into(),
            source: RecordSource::Inventory,
        };
        let row = |record: MachineRecord, state| {
            Write::Row(Row {
                record,
                state,
                since: at,
                reason: "r".into(),
                now: at,
            })
        };
        let mut other = record.clone();
        other.address = "10.0.0.2".into();
        other.hostname = "n2".into();
        s.persist(vec![
            row(other.clone(), MachineState::Uninitialized),
            row(record.clone(), MachineState::Uninitialized),
        ])
        .await
        .unwrap();
        s.persist(vec![
            row(record.clone(), MachineState::Healthy),
            Write::Transition {
                address: record.address.clone(),
                from: "uninitialized".into(),
                to: MachineState::Healthy,
                at,
                reason: "reported".into(),
            },
            Write::Boot {
                address: record.address.clone(),
                boot_id: "b1".into(),
            },
            Write::Delete(other.address.clone()),
        ])
        .await
        .unwrap();
        let all = s.machines().await.unwrap();
        assert_eq!(all.len(), 1);
        let m = &all[0];
        assert_eq!(m.record, record);
        assert_eq!(
            (m.state, m.since, m.reason.as_str()),
            (MachineState::Healthy, at, "r")
        );
        assert_eq!(m.boot_id.as_deref(), Some("b1"));
        assert!(m.reported);
        let t = s.transitions(record.address.clone(), 10).await.unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].from.as_str(), t[0].to.as_str()),
            ("uninitialized", "healthy")
        );
    }

    /// Each machine keeps its newest transitions only.
    pub async fn each_machine_keeps_its_newest_transitions_only(s: &Store) {
        let n = KEEP_TRANSITIONS + 40;
        // In several commits, as the sweeps write them, and beside a quiet machine.
        for start in (0..n).step_by(100) {
            let chunk = (start..n.min(start + 100))
                .map(|i| transition("10.0.0.1", i))
                .collect();
            s.persist(chunk).await.unwrap();
        }
        s.persist(vec![transition("10.0.0.2", 0), transition("10.0.0.2", 1)])
            .await
            .unwrap();
        let flaps = s.transitions("10.0.0.1".into(), 10_000).await.unwrap();
        assert_eq!(flaps.len(), KEEP_TRANSITIONS as usize);
        assert_eq!(flaps[0].reason, format!("flap {}", KEEP_TRANSITIONS + 39));
        assert_eq!(flaps.last().unwrap().reason, "flap 40", "the oldest went");
        assert_eq!(
            s.transitions("10.0.0.2".into(), 10_000)
                .await
                .unwrap()
                .len(),
            2
        );
    }

    /// An inventory import's batch (300 machines, each with its record, a transition and a
    /// boot id: more than one etcd transaction holds) is stored whole.
    pub async fn many_machines_in_one_batch(s: &Store) {
        let at = from_unix_ms(1_800_000_000_000);
        let mut writes = Vec::new();
        for i in 0..300 {
            let address = format!("10.1.{}.{}", i / 200, i % 200);
            writes.push(Write::Row(Row {
                record: MachineRecord {
                    address: address.clone(),
                    hostname: format!("n{i}"),
                    serial: format!("S{i}"),
                    rack: format!("r{}", i % 7),
                    role: "worker".into(),
                    machine_type: Some("qemu".into()),
                    labels: Default::default(),
                    source: RecordSource::Inventory,
                },
                state: MachineState::Uninitialized,
                since: at,
                reason: "imported".into(),
                now: at,
            }));
            writes.push(Write::Transition {
                address: address.clone(),
                from: "uninitialized".into(),
                to: MachineState::Healthy,
                at,
                reason: "reported".into(),
            });
            writes.push(Write::Boot {
                address,
                boot_id: format!("b{i}"),
            });
        }
        s.persist(writes).await.unwrap();
        let all = s.machines().await.unwrap();
        assert_eq!(all.len(), 300);
        assert!(
            all.windows(2)
                .all(|w| w[0].record.address < w[1].record.address)
        );
        let m = all
            .iter()
            .find(|m| m.record.address == "10.1.1.99")
            .unwrap();
        assert_eq!(
            (m.record.hostname.as_str(), m.boot_id.as_deref(), m.reported),
            ("n299", Some("b299"), true)
        );
        assert_eq!(s.transitions("10.1.0.0".into(), 10).await.unwrap().len(), 1);
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn sqlite_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::machines_round_trip(&store).await;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::each_machine_keeps_its_newest_transitions_only(&store).await;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        super::conformance::many_machines_in_one_batch(&store).await;
    }
}
