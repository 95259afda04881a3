//! Machines on SQLite: the `machines` rows and the `machine_transitions` history of
//! migration 0001, [`MachineStore`] for [`Sqlite`].

use protocol::admin::machines::StateTransition;
use rusqlite::params;

use super::{KEEP_TRANSITIONS, MachineStore, StoredMachine, Write};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::health::MachineState;
use crate::inventory::{MachineRecord, RecordSource};
use crate::store::{Sqlite, StoreError};

impl MachineStore for Sqlite {
    async fn machines(&self) -> Result<Vec<StoredMachine>, StoreError> {
        self.call(load).await
    }

    async fn persist(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.call(move |c| persist(c, &writes)).await
    }

    async fn transitions(
        &self,
        address: String,
        limit: i64,
    ) -> Result<Vec<StateTransition>, StoreError> {
        self.call(move |c| transitions(c, &address, limit)).await
    }
}

/// Applies `writes` in one transaction.
fn persist(conn: &mut rusqlite::Connection, writes: &[Write]) -> rusqlite::Result<()> {
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
fn load(conn: &mut rusqlite::Connection) -> rusqlite::Result<Vec<StoredMachine>> {
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
fn transitions(
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
