//! The registry's SQL: the `machines` rows and the `machine_transitions` history of
//! migration 0001. Nothing here holds state or decides; [`super::Fleet`] calls these
//! inside `Store::call`.

use jiff::Timestamp;
use protocol::admin::machines::StateTransition;
use rusqlite::params;

use crate::clock::{from_unix_ms, to_unix_ms};
use crate::health::MachineState;
use crate::inventory::{MachineRecord, RecordSource};

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
    pub(super) fn log(self, changed: &[super::index::Entry]) {
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

/// A machine as stored: its record and last state.
#[derive(Debug)]
pub(super) struct StoredMachine {
    pub(super) record: MachineRecord,
    pub(super) state: MachineState,
    pub(super) since: Timestamp,
    pub(super) reason: String,
    /// The boot id its agent last reported, to this run or an earlier one.
    pub(super) boot_id: Option<String>,
    /// Its stored history has a report's state (healthy or unhealthy): its agent reported
    /// at some time, perhaps before this coordinator started.
    pub(super) reported: bool,
}

/// One database write, applied with others in one transaction.
#[derive(Debug)]
pub(super) enum Write {
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
pub(super) struct Row {
    pub(super) record: MachineRecord,
    pub(super) state: MachineState,
    pub(super) since: Timestamp,
    pub(super) reason: String,
    /// When it is written (`updated_ms`, and `created_ms` of a new row).
    pub(super) now: Timestamp,
}

/// Transitions kept per machine: its newest ones. Without a bound the table would grow for
/// as long as the coordinator runs, fastest for a flapping machine (two rows per flap, every
/// few reports); `machines show` prints the newest [`super::SHOW_TRANSITIONS`].
pub(super) const KEEP_TRANSITIONS: i64 = 500;

/// Applies `writes` in one transaction.
pub(super) fn persist(conn: &mut rusqlite::Connection, writes: &[Write]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for w in writes {
        match w {
            Write::Row(r) => {
                let labels =
                    serde_json::to_string(&r.record.labels).expect("string map serialises to JSON");
                tx.execute(
                    "INSERT INTO machines (address, hostname, serial, rack, role, machine_type, \
                     labels, source, state, state_since_ms, state_reason, created_ms, updated_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12) \
                     ON CONFLICT(address) DO UPDATE SET hostname = excluded.hostname, \
                     serial = excluded.serial, rack = excluded.rack, role = excluded.role, \
                     machine_type = excluded.machine_type, labels = excluded.labels, \
                     source = excluded.source, state = excluded.state, \
                     state_since_ms = excluded.state_since_ms, \
                     state_reason = excluded.state_reason, updated_ms = excluded.updated_ms",
                    params![
                        r.record.address,
                        r.record.hostname,
                        r.record.serial,
                        r.record.rack,
                        r.record.role,
                        r.record.machine_type,
                        labels,
                        r.record.source.as_str(),
                        r.state.as_str(),
                        to_unix_ms(r.since),
                        r.reason,
                        to_unix_ms(r.now),
                    ],
                )?;
            }
            Write::Delete(address) => {
                tx.execute("DELETE FROM machines WHERE address = ?1", [address])?;
            }
            Write::Boot { address, boot_id } => {
                tx.execute(
                    "UPDATE machines SET boot_id = ?2 WHERE address = ?1",
                    params![address, boot_id],
                )?;
            }
            Write::Transition {
                address,
                from,
                to,
                at,
                reason,
            } => {
                tx.prepare_cached(
                    "INSERT INTO machine_transitions (address, from_state, to_state, at_ms, reason) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![address, from, to.as_str(), to_unix_ms(*at), reason])?;
                // The machine's rows older than its newest KEEP_TRANSITIONS, found through
                // the (address, id) index: a machine with fewer rows costs a short walk.
                tx.prepare_cached(
                    "DELETE FROM machine_transitions WHERE address = ?1 AND id <= \
                     (SELECT id FROM machine_transitions WHERE address = ?1 \
                      ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                )?
                .execute(params![address, KEEP_TRANSITIONS])?;
            }
        }
    }
    tx.commit()
}

/// Every stored machine, ordered by address.
pub(super) fn load(conn: &mut rusqlite::Connection) -> rusqlite::Result<Vec<StoredMachine>> {
    let mut stmt = conn.prepare(
        "SELECT address, hostname, serial, rack, role, machine_type, labels, source, state, \
         state_since_ms, state_reason, boot_id, \
         EXISTS (SELECT 1 FROM machine_transitions t WHERE t.address = machines.address \
                 AND t.to_state IN ('healthy', 'unhealthy')) \
         FROM machines ORDER BY address",
    )?;
    let rows = stmt.query_map([], |r| {
        let labels: String = r.get(6)?;
        let source: String = r.get(7)?;
        let state: String = r.get(8)?;
        Ok(StoredMachine {
            record: MachineRecord {
                address: r.get(0)?,
                hostname: r.get(1)?,
                serial: r.get(2)?,
                rack: r.get(3)?,
                role: r.get(4)?,
                machine_type: r.get(5)?,
                labels: serde_json::from_str(&labels).unwrap_or_default(),
                source: RecordSource::parse(&source),
            },
            // A state this build does not know (written by a newer one) reads as
            // uninitialized and is re-derived from the next report.
            state: state.parse().unwrap_or(MachineState::Uninitialized),
            since: from_unix_ms(r.get(9)?),
            reason: r.get(10)?,
            boot_id: r.get(11)?,
            reported: r.get(12)?,
        })
    })?;
    rows.collect()
}

/// Transitions of a machine, most recent first, at most `limit`.
pub(super) fn transitions(
    c: &mut rusqlite::Connection,
    address: &str,
    limit: i64,
) -> rusqlite::Result<Vec<StateTransition>> {
    let mut stmt = c.prepare(
        "SELECT from_state, to_state, at_ms, reason FROM machine_transitions \
         WHERE address = ?1 ORDER BY id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![address, limit], |r| {
        Ok(StateTransition {
            from: r.get(0)?,
            to: r.get(1)?,
            at_unix_ms: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
            reason: r.get(3)?,
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transition(address: &str, i: i64) -> Write {
        Write::Transition {
            address: address.into(),
            from: "healthy".into(),
            to: MachineState::Unreachable,
            at: from_unix_ms(1_800_000_000_000 + i),
            reason: format!("flap {i}"),
        }
    }

    #[test]
    fn each_machine_keeps_its_newest_transitions_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("c.db")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(store.call(|c| {
            let flapping: Vec<Write> = (0..KEEP_TRANSITIONS + 40)
                .map(|i| transition("10.0.0.1", i))
                .collect();
            // In several commits, as the sweeps write them, and beside a quiet machine.
            for chunk in flapping.chunks(100) {
                persist(c, chunk)?;
            }
            persist(c, &[transition("10.0.0.2", 0), transition("10.0.0.2", 1)])?;
            let flaps = transitions(c, "10.0.0.1", 10_000)?;
            assert_eq!(flaps.len(), KEEP_TRANSITIONS as usize);
            assert_eq!(flaps[0].reason, format!("flap {}", KEEP_TRANSITIONS + 39));
            assert_eq!(flaps.last().unwrap().reason, "flap 40", "the oldest went");
            assert_eq!(transitions(c, "10.0.0.2", 10_000)?.len(), 2);
            Ok(())
        }))
        .unwrap();
    }
}
