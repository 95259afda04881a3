//! The remediation tables on SQLite (migrations 0005 and 0010): the decision journal, the
//! operator switches, cleared machines, repair outcomes and the loop's own entries;
//! [`RemediationStore`] for [`Sqlite`].

use std::collections::BTreeMap;

use protocol::admin::remediation::{EventsQuery, JournalLine};
use rusqlite::{Connection, OptionalExtension, params};

use super::{RemediationStore, Resume, Switchboard};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::remediation::decision::{Decision, Outcome, Rule};
use crate::remediation::input::RepairOutcome;
use crate::remediation::journal::{DEFAULT_EVENTS_LIMIT, JournalWrite, LastLine, operation};
use crate::store::{Sqlite, StoreError};

impl RemediationStore for Sqlite {
    async fn switchboard(&self) -> Result<Switchboard, StoreError> {
        self.call(|c| {
            Ok(Switchboard {
                switches: switches(c)?,
                cleared: cleared(c)?,
            })
        })
        .await
    }

    async fn set_switch(
        &self,
        key: String,
        value: Option<String>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.call(move |c| set_switch(c, &key, value.as_deref(), now_ms))
            .await
    }

    async fn clear_machine(&self, address: String, at_ms: i64) -> Result<Option<bool>, StoreError> {
        self.call(move |c| clear_machine(c, &address, at_ms)).await
    }

    async fn resume(
        &self,
        admitted_since_ms: i64,
        outcomes_since_ms: i64,
        last_pass_since_ms: i64,
    ) -> Result<Resume, StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            Ok(Resume {
                max_seq: max_seq(&tx)?,
                admissions: admissions(&tx, admitted_since_ms)?,
                outcomes: outcomes(&tx, outcomes_since_ms)?,
                last_pass: last_pass(&tx, last_pass_since_ms)?,
                own_entries: own_entries(&tx)?,
            })
        })
        .await
    }

    async fn write_journal(&self, writes: Vec<JournalWrite>) -> Result<Vec<i64>, StoreError> {
        self.call(move |c| write(c, &writes)).await
    }

    async fn prune_journal(&self, before_ms: i64, max_rows: u64) -> Result<usize, StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            let n = prune(&tx, before_ms, max_rows)?;
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    async fn events(&self, query: EventsQuery) -> Result<Vec<JournalLine>, StoreError> {
        self.call(move |c| query_lines(c, &query)).await
    }

    async fn add_outcomes(
        &self,
        new: Vec<(u64, RepairOutcome)>,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        self.call(move |c| add_outcomes(c, &new, before_ms)).await
    }

    async fn update_own_entries(
        &self,
        added: Vec<(u64, String)>,
        gone: Vec<u64>,
        at_ms: i64,
    ) -> Result<(), StoreError> {
        self.call(move |c| update_own_entries(c, &added, &gone, at_ms))
            .await
    }
}

/// Commits `writes` in one transaction; returns the id of each line written, in order.
pub(crate) fn write(c: &mut Connection, writes: &[JournalWrite]) -> rusqlite::Result<Vec<i64>> {
    let tx = c.transaction()?;
    let mut ids = Vec::with_capacity(writes.len());
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO remediation_journal (seq, first_ms, last_ms, count, address, domain, \
             outcome, rule, operation, sentence, decision) VALUES (?1, ?2, ?2, 1, ?3, ?4, ?5, ?6, \
             ?7, ?8, ?9)",
        )?;
        let mut repeat = tx.prepare_cached(
            "UPDATE remediation_journal SET seq = ?2, last_ms = ?3, count = count + 1, \
             sentence = ?4, decision = ?5 WHERE id = ?1",
        )?;
        for w in writes {
            match w {
                JournalWrite::Insert { seq, decision: d } => {
                    insert.execute(params![
                        *seq as i64,
                        to_unix_ms(d.at),
                        d.address,
                        d.domain,
                        d.outcome.as_str(),
                        d.rule.as_str(),
                        operation(d),
                        d.sentence,
                        serde_json::to_string(d).unwrap_or_default(),
                    ])?;
                    ids.push(tx.last_insert_rowid());
                }
                JournalWrite::Repeat {
                    id,
                    seq,
                    decision: d,
                } => {
                    repeat.execute(params![
                        id,
                        *seq as i64,
                        to_unix_ms(d.at),
                        d.sentence,
                        serde_json::to_string(d).unwrap_or_default(),
                    ])?;
                    ids.push(*id);
                }
            }
        }
    }
    tx.commit()?;
    Ok(ids)
}

/// The largest sequence number written so far (0 for an empty journal).
pub(crate) fn max_seq(c: &Connection) -> rusqlite::Result<u64> {
    c.query_row(
        "SELECT COALESCE(MAX(seq), 0) FROM remediation_journal",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(|v| v.max(0) as u64)
}

/// The lines of the last pass journalled at or after `since_ms` (every line last seen at
/// the journal's latest time): (id, address, outcome, rule, operation). A restarted loop
/// continues their repeats instead of starting new lines.
pub(crate) fn last_pass(c: &Connection, since_ms: i64) -> rusqlite::Result<Vec<LastLine>> {
    let mut st = c.prepare(
        "SELECT id, address, outcome, rule, operation FROM remediation_journal WHERE last_ms = \
         (SELECT MAX(last_ms) FROM remediation_journal) AND last_ms >= ?1",
    )?;
    let rows = st.query_map([since_ms], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
    })?;
    rows.collect()
}

/// Admissions made at or after `since_ms`, as decisions (for the rate limit and escalation).
pub(crate) fn admissions(c: &Connection, since_ms: i64) -> rusqlite::Result<Vec<Decision>> {
    let mut st = c.prepare(
        "SELECT decision FROM remediation_journal WHERE outcome = 'admitted' AND first_ms >= ?1 \
         ORDER BY id",
    )?;
    let rows = st.query_map([since_ms], |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for json in rows {
        if let Ok(d) = serde_json::from_str::<Decision>(&json?) {
            out.push(d);
        }
    }
    Ok(out)
}

/// Deletes lines last seen before `before_ms`, then all but the newest `max_rows`.
/// Returns how many went.
pub(crate) fn prune(c: &Connection, before_ms: i64, max_rows: u64) -> rusqlite::Result<usize> {
    let old = c.execute(
        "DELETE FROM remediation_journal WHERE last_ms < ?1",
        [before_ms],
    )?;
    let extra = c.execute(
        "DELETE FROM remediation_journal WHERE seq <= (SELECT seq FROM remediation_journal \
         ORDER BY seq DESC LIMIT 1 OFFSET ?1)",
        [i64::try_from(max_rows).unwrap_or(i64::MAX)],
    )?;
    Ok(old + extra)
}

/// Lines matching `q`, ordered by `seq` (the newest `limit` of them).
pub(crate) fn query_lines(c: &Connection, q: &EventsQuery) -> rusqlite::Result<Vec<JournalLine>> {
    let limit = if q.limit == 0 {
        DEFAULT_EVENTS_LIMIT
    } else {
        q.limit
    };
    let mut st = c.prepare(
        "SELECT seq, first_ms, last_ms, count, address, domain, outcome, rule, operation, \
         sentence FROM remediation_journal WHERE (?1 IS NULL OR address = ?1) AND (?2 IS NULL \
         OR last_ms >= ?2) AND seq > ?3 ORDER BY seq DESC LIMIT ?4",
    )?;
    let rows = st.query_map(
        params![
            q.machine,
            q.since_unix_ms.map(|v| v as i64),
            q.after_seq.unwrap_or(0) as i64,
            limit
        ],
        |r| {
            Ok(JournalLine {
                seq: r.get::<_, i64>(0)? as u64,
                first_unix_ms: r.get::<_, i64>(1)? as u64,
                last_unix_ms: r.get::<_, i64>(2)? as u64,
                count: r.get::<_, i64>(3)? as u64,
                address: r.get(4)?,
                domain: r.get(5)?,
                outcome: r.get(6)?,
                rule: r.get(7)?,
                operation: r.get(8)?,
                sentence: r.get(9)?,
            })
        },
    )?;
    let mut out = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    out.reverse();
    Ok(out)
}

/// Every switch ever set: key → (value, set at ms).
pub(crate) fn switches(c: &Connection) -> rusqlite::Result<BTreeMap<String, (String, i64)>> {
    let mut st = c.prepare("SELECT key, value, set_ms FROM remediation_switches")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?;
    rows.collect()
}

/// Sets (`Some`) or removes (`None`) one switch.
pub(crate) fn set_switch(
    c: &Connection,
    key: &str,
    value: Option<&str>,
    now_ms: i64,
) -> rusqlite::Result<()> {
    match value {
        Some(v) => c.execute(
            "INSERT INTO remediation_switches (key, value, set_ms) VALUES (?1, ?2, ?3) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, set_ms = excluded.set_ms",
            params![key, v, now_ms],
        )?,
        None => c.execute("DELETE FROM remediation_switches WHERE key = ?1", [key])?,
    };
    Ok(())
}

/// Every cleared machine and when.
pub(crate) fn cleared(c: &Connection) -> rusqlite::Result<BTreeMap<String, jiff::Timestamp>> {
    let mut st = c.prepare("SELECT address, at_ms FROM remediation_cleared")?;
    let rows = st.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, from_unix_ms(r.get::<_, i64>(1)?)))
    })?;
    rows.collect()
}

/// Records that `address` was cleared at `at_ms`.
pub(crate) fn set_cleared(c: &Connection, address: &str, at_ms: i64) -> rusqlite::Result<()> {
    c.execute(
        "INSERT INTO remediation_cleared (address, at_ms) VALUES (?1, ?2) \
         ON CONFLICT (address) DO UPDATE SET at_ms = excluded.at_ms",
        params![address, at_ms],
    )?;
    Ok(())
}

/// `machines clear`: forgets the machine's remediations before `at_ms` for `needs-human`.
/// `None` when no machine has this address (nothing written); otherwise whether the
/// machine's newest decision held it as `needs-human`.
pub(crate) fn clear_machine(
    c: &mut Connection,
    address: &str,
    at_ms: i64,
) -> rusqlite::Result<Option<bool>> {
    let tx = c.transaction()?;
    let known: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM machines WHERE address = ?1)",
        [address],
        |r| r.get(0),
    )?;
    if !known {
        return Ok(None);
    }
    let newest: Option<(String, String)> = tx
        .query_row(
            "SELECT outcome, rule FROM remediation_journal WHERE address = ?1 \
             ORDER BY seq DESC LIMIT 1",
            [address],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let was =
        newest.is_some_and(|(o, r)| o == Outcome::Held.as_str() && r == Rule::NeedsHuman.as_str());
    set_cleared(&tx, address, at_ms)?;
    tx.commit()?;
    Ok(Some(was))
}

/// Repair outcomes finished at or after `since_ms`, with their entry index.
pub(crate) fn outcomes(
    c: &Connection,
    since_ms: i64,
) -> rusqlite::Result<Vec<(u64, RepairOutcome)>> {
    let mut st = c.prepare(
        "SELECT entry_idx, address, finished_ms, succeeded FROM remediation_outcomes \
         WHERE finished_ms >= ?1 ORDER BY finished_ms",
    )?;
    let rows = st.query_map([since_ms], |r| {
        Ok((
            r.get::<_, i64>(0)? as u64,
            RepairOutcome {
                address: r.get(1)?,
                finished_at: from_unix_ms(r.get(2)?),
                succeeded: r.get::<_, i64>(3)? != 0,
            },
        ))
    })?;
    rows.collect()
}

/// Records outcomes (an index already recorded is kept as it was) and deletes those that
/// finished before `before_ms`.
pub(crate) fn add_outcomes(
    c: &mut Connection,
    new: &[(u64, RepairOutcome)],
    before_ms: i64,
) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    {
        let mut st = tx.prepare_cached(
            "INSERT OR IGNORE INTO remediation_outcomes (entry_idx, address, finished_ms, \
             succeeded) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (idx, o) in new {
            st.execute(params![
                *idx as i64,
                o.address,
                to_unix_ms(o.finished_at),
                i64::from(o.succeeded)
            ])?;
        }
        tx.execute(
            "DELETE FROM remediation_outcomes WHERE finished_ms < ?1",
            [before_ms],
        )?;
    }
    tx.commit()
}

/// Indexes of the repair queue entries the loop enqueued itself and still knows of.
pub(crate) fn own_entries(c: &Connection) -> rusqlite::Result<Vec<u64>> {
    let mut st = c.prepare("SELECT entry_idx FROM remediation_entries ORDER BY entry_idx")?;
    let rows = st.query_map([], |r| Ok(r.get::<_, i64>(0)? as u64))?;
    rows.collect()
}

/// Records entries the loop just enqueued (`(index, address)`, at `at_ms`), and forgets
/// `gone`: entries that have left the queue.
pub(crate) fn update_own_entries(
    c: &mut Connection,
    added: &[(u64, String)],
    gone: &[u64],
    at_ms: i64,
) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    {
        let mut ins = tx.prepare_cached(
            "INSERT OR IGNORE INTO remediation_entries (entry_idx, address, admitted_ms) \
             VALUES (?1, ?2, ?3)",
        )?;
        for (idx, address) in added {
            ins.execute(params![*idx as i64, address, at_ms])?;
        }
        let mut del = tx.prepare_cached("DELETE FROM remediation_entries WHERE entry_idx = ?1")?;
        for idx in gone {
            del.execute([*idx as i64])?;
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn clearing_says_whether_the_machine_needed_a_human_and_refuses_unknown_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let r = store
            .call(|c| {
                c.execute(
                    "INSERT INTO machines (address, hostname, source, state, state_since_ms, \
                     created_ms, updated_ms) VALUES \
                     ('10.0.0.1', 'n1', 'inventory', 'healthy', 0, 0, 0), \
                     ('10.0.0.2', 'n2', 'inventory', 'healthy', 0, 0, 0)",
                    [],
                )?;
                let line = "INSERT INTO remediation_journal (seq, first_ms, last_ms, count, \
                            address, domain, outcome, rule, sentence, decision) \
                            VALUES (?1, 0, 0, 1, ?2, 'rack-1', ?3, ?4, 's', '{}')";
                c.execute(line, params![1, "10.0.0.1", "admitted", "unhealthy"])?;
                c.execute(line, params![2, "10.0.0.1", "held", "needs-human"])?;
                c.execute(line, params![3, "10.0.0.2", "held", "needs-human"])?;
                c.execute(line, params![4, "10.0.0.2", "held", "paused"])?;
                Ok((
                    clear_machine(c, "10.0.0.1", 10)?,
                    clear_machine(c, "10.0.0.2", 10)?,
                    clear_machine(c, "10.0.0.9", 10)?,
                    cleared(c)?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(r.0, Some(true), "newest decision held it as needs-human");
        assert_eq!(r.1, Some(false), "its newest decision is another hold");
        assert_eq!(r.2, None, "no such machine");
        assert_eq!(r.3.len(), 2, "only known machines are written: {:?}", r.3);
    }

    #[tokio::test]
    async fn entries_admitted_before_the_table_existed_are_the_loops_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let own = store
            .call(|c| {
                // As a store of the previous version: no table yet, admissions journalled.
                c.execute_batch("DROP TABLE remediation_entries")?;
                let line = "INSERT INTO remediation_journal (seq, first_ms, last_ms, count, \
                            address, domain, outcome, rule, sentence, decision) \
                            VALUES (?1, 5, 5, 1, ?2, 'rack-1', ?3, 'auto-repair', ?4, '{}')";
                let admitted = "admitted: 10.0.0.1 operation unhealthy (auto-repair): \
                                unhealthy for 17s (failing: kubelet:kubelet) (repair queue entry 12)";
                c.execute(line, params![1, "10.0.0.1", "admitted", admitted])?;
                let held = "held: 10.0.0.2 already has repair queue entry 3 (operation x, failed)";
                c.execute(line, params![2, "10.0.0.2", "held", held])?;
                c.execute(line, params![3, "10.0.0.3", "admitted", "no entry named"])?;
                c.execute_batch(include_str!(
                    "../../store/migrations/0010_remediation_entries.sql"
                ))?;
                own_entries(c)
            })
            .await
            .unwrap();
        assert_eq!(own, [12]);
    }
}
