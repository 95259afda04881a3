//! The areas as `coordinator migrate` copies them, one function each, in the order they go:
//! machines first (a cleared machine names one), the journal before the clearings (a
//! clearing reads the machine's newest decision).
//!
//! Each reads the SQLite store (through its area's trait, or SQL where the trait does not
//! show everything) and writes the etcd store, and returns what it copied.

use jiff::Timestamp;
use rusqlite::OptionalExtension;

use super::{Copied, Progress};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::fence::store::FenceStore;
use crate::fence::store::etcd::StepLink;
use crate::fleet::store::{KEEP_TRANSITIONS, MachineStore, Row, Write as MachineWrite};
use crate::health::MachineState;
use crate::kdump::store::KdumpStore;
use crate::remediation::decision::Decision;
use crate::remediation::input::RepairOutcome;
use crate::remediation::journal::JournalWrite;
use crate::remediation::store::RemediationStore;
use crate::repair::store::RepairQueueStore;
use crate::repair::store::diagnostics::{DiagnosticsStore, NewBundle};
use crate::repair::store::groups::CommandGroupStore;
use crate::store::{EtcdStore, Sqlite, StoreError};

/// Area names, as the report prints them.
pub(super) const MACHINES: &str = "machines";
pub(super) const REPAIR: &str = "repair queue";
pub(super) const FENCE: &str = "fence flows";
pub(super) const KDUMP: &str = "kdump notices";
pub(super) const DIAGNOSTICS: &str = "diagnostics";
pub(super) const GROUPS: &str = "command groups";
pub(super) const REMEDIATION: &str = "remediation";

/// Journal lines per etcd write: a pass writes about as many, so a driver takes them.
const JOURNAL_BATCH: usize = 50;

/// Transitions per etcd write: well under etcd's 128 operations per transaction.
const TRANSITION_BATCH: usize = 50;

/// Copies every area; the first that fails stops the copy, named.
pub(super) async fn copy_all(
    src: &Sqlite,
    dst: &EtcdStore,
    progress: Progress<'_>,
) -> Result<Vec<Copied>, (&'static str, StoreError)> {
    let named = |area: &'static str| move |e: StoreError| (area, e);
    Ok(vec![
        machines(src, dst, progress)
            .await
            .map_err(named(MACHINES))?,
        repair_queue(src, dst, progress)
            .await
            .map_err(named(REPAIR))?,
        fence_flows(src, dst, progress)
            .await
            .map_err(named(FENCE))?,
        kdump(src, dst).await.map_err(named(KDUMP))?,
        diagnostics(src, dst, progress)
            .await
            .map_err(named(DIAGNOSTICS))?,
        groups(src, dst).await.map_err(named(GROUPS))?,
        remediation(src, dst).await.map_err(named(REMEDIATION))?,
    ])
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The next number SQLite's AUTOINCREMENT would give in `table` (1 when it gave none).
async fn next_of(src: &Sqlite, table: &'static str) -> Result<u64, StoreError> {
    let seq = src
        .call(move |c| {
            c.query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = ?1",
                [table],
                |r| r.get::<_, i64>(0),
            )
            .optional()
        })
        .await?;
    Ok(seq.map(|s| s.max(0) as u64 + 1).unwrap_or(1))
}

async fn machines(
    src: &Sqlite,
    dst: &EtcdStore,
    progress: Progress<'_>,
) -> Result<Copied, StoreError> {
    let all = MachineStore::machines(src).await?;
    let n = all.len() as u64;
    let mut lines = 0u64;
    for (done, m) in all.into_iter().enumerate() {
        progress(MACHINES, done as u64, n);
        let address = m.record.address.clone();
        let mut history = MachineStore::transitions(src, address.clone(), KEEP_TRANSITIONS).await?;
        history.reverse();
        let row = |m: &crate::fleet::store::StoredMachine| {
            MachineWrite::Row(Row {
                record: m.record.clone(),
                state: m.state,
                since: m.since,
                reason: m.reason.clone(),
                now: m.since,
            })
        };
        dst.persist(vec![row(&m)]).await?;
        for chunk in history.chunks(TRANSITION_BATCH) {
            let writes = chunk
                .iter()
                .map(|t| MachineWrite::Transition {
                    address: address.clone(),
                    from: t.from.clone(),
                    // Written by this coordinator's SQLite driver, which reads it back alike.
                    to: t.to.parse().unwrap_or(MachineState::Uninitialized),
                    at: from_unix_ms(t.at_unix_ms as i64),
                    reason: t.reason.clone(),
                })
                .collect::<Vec<_>>();
            lines += writes.len() as u64;
            dst.persist(writes).await?;
        }
        // The row again, last: it is the machine's state now, whatever a transition wrote.
        let mut last = vec![row(&m)];
        if let Some(boot_id) = m.boot_id.clone() {
            last.push(MachineWrite::Boot { address, boot_id });
        }
        dst.persist(last).await?;
    }
    Ok(Copied {
        area: MACHINES,
        items: n,
        detail: format!(
            "{}, {}",
            plural(n, "machine", "machines"),
            plural(lines, "state transition", "state transitions")
        ),
    })
}

async fn repair_queue(
    src: &Sqlite,
    dst: &EtcdStore,
    progress: Progress<'_>,
) -> Result<Copied, StoreError> {
    let (enabled, entries) = RepairQueueStore::load(src).await?;
    let next = next_of(src, "repair_queue_entries")
        .await?
        .max(entries.iter().map(|e| e.index + 1).max().unwrap_or(1));
    let n = entries.len() as u64;
    let mut lines = 0u64;
    let mut all = Vec::with_capacity(entries.len());
    for e in entries {
        let h = RepairQueueStore::history(src, e.index).await?;
        lines += h.len() as u64;
        all.push((e, h));
    }
    dst.import_repair_queue(enabled, all, next, &|done| progress(REPAIR, done, n))
        .await?;
    Ok(Copied {
        area: REPAIR,
        items: n,
        detail: format!(
            "{}, {}, next index {next}, {}",
            plural(n, "entry", "entries"),
            plural(lines, "history line", "history lines"),
            if enabled { "enabled" } else { "disabled" }
        ),
    })
}

async fn fence_flows(
    src: &Sqlite,
    dst: &EtcdStore,
    progress: Progress<'_>,
) -> Result<Copied, StoreError> {
    let mut flows = FenceStore::list(src, u32::MAX).await?;
    flows.reverse();
    let links: Vec<StepLink> = src
        .call(|c| {
            let mut stmt = c.prepare(
                "SELECT step_key, entry_index, flow_id, created_ms FROM repair_fence_flows \
                 ORDER BY flow_id, step_key",
            )?;
            stmt.query_map([], |r| {
                Ok(StepLink {
                    step: r.get(0)?,
                    entry: r.get::<_, i64>(1)? as u64,
                    flow: r.get::<_, i64>(2)? as u64,
                    created_ms: r.get(3)?,
                })
            })?
            .collect()
        })
        .await?;
    let next = next_of(src, "fence_flows")
        .await?
        .max(flows.iter().map(|f| f.id + 1).max().unwrap_or(1));
    let n = flows.len() as u64;
    let (mut lines, mut unfinished) = (0u64, 0u64);
    for (done, f) in flows.iter().enumerate() {
        progress(FENCE, done as u64, n);
        let h = FenceStore::history(src, f.id).await?;
        lines += h.len() as u64;
        let mine: Vec<StepLink> = links.iter().filter(|l| l.flow == f.id).cloned().collect();
        if !matches!(
            f.state,
            crate::fence::flow::State::Done | crate::fence::flow::State::Failed { .. }
        ) {
            unfinished += 1;
        }
        dst.import_fence_flow(f, &h, &mine).await?;
    }
    dst.import_fence_write_index(next).await?;
    Ok(Copied {
        area: FENCE,
        items: n,
        detail: format!(
            "{} ({unfinished} unfinished), {}, {}, next id {next}",
            plural(n, "flow", "flows"),
            plural(lines, "history line", "history lines"),
            plural(links.len() as u64, "step link", "step links"),
        ),
    })
}

async fn kdump(src: &Sqlite, dst: &EtcdStore) -> Result<Copied, StoreError> {
    let notices = KdumpStore::notices(src).await?;
    let n = notices.len() as u64;
    let now = Timestamp::now();
    for (address, record) in notices {
        dst.save_notice(address, record, now).await?;
    }
    Ok(Copied {
        area: KDUMP,
        items: n,
        detail: plural(n, "machine's last notice", "machines' last notices"),
    })
}

async fn diagnostics(
    src: &Sqlite,
    dst: &EtcdStore,
    progress: Progress<'_>,
) -> Result<Copied, StoreError> {
    // SQL: a bundle's request id (what a resend replaces) is not in the trait's listing.
    let bundles: Vec<NewBundle> = src
        .call(|c| {
            let mut stmt = c.prepare(
                "SELECT entry_idx, address, request_id, collected_ms, bytes, truncated_parts, \
                 content FROM repair_diagnostics ORDER BY id",
            )?;
            stmt.query_map([], |r| {
                Ok(NewBundle {
                    entry: r.get::<_, i64>(0)? as u64,
                    address: r.get(1)?,
                    request_id: r.get(2)?,
                    collected_ms: r.get(3)?,
                    bytes: r.get(4)?,
                    truncated_parts: r.get(5)?,
                    content: r.get(6)?,
                })
            })?
            .collect()
        })
        .await?;
    let n = bundles.len() as u64;
    let bytes: u64 = bundles.iter().map(|b| b.content.len() as u64).sum();
    for (done, b) in bundles.into_iter().enumerate() {
        progress(DIAGNOSTICS, done as u64, n);
        dst.keep_bundle(b).await?;
    }
    Ok(Copied {
        area: DIAGNOSTICS,
        items: n,
        detail: format!("{} ({bytes} bytes)", plural(n, "bundle", "bundles")),
    })
}

async fn groups(src: &Sqlite, dst: &EtcdStore) -> Result<Copied, StoreError> {
    let groups = CommandGroupStore::groups(src).await?;
    let n = groups.len() as u64;
    let now = Timestamp::now();
    for g in groups {
        dst.record_group(g, now).await?;
    }
    Ok(Copied {
        area: GROUPS,
        items: n,
        detail: format!(
            "{} (commands of a stopped coordinator, killed before they run again)",
            plural(n, "process group", "process groups")
        ),
    })
}

async fn remediation(src: &Sqlite, dst: &EtcdStore) -> Result<Copied, StoreError> {
    // SQL: each line's decision as stored, with its sequence number.
    let journal: Vec<(u64, Decision)> = src
        .call(|c| {
            let mut stmt =
                c.prepare("SELECT seq, decision FROM remediation_journal ORDER BY seq")?;
            stmt.query_map([], |r| {
                let text: String = r.get(1)?;
                let d = serde_json::from_str(&text).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        1,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })?;
                Ok((r.get::<_, i64>(0)? as u64, d))
            })?
            .collect()
        })
        .await?;
    let outcomes: Vec<(u64, RepairOutcome)> = src
        .call(|c| {
            let mut stmt = c.prepare(
                "SELECT entry_idx, address, finished_ms, succeeded FROM remediation_outcomes \
                 ORDER BY entry_idx",
            )?;
            stmt.query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    RepairOutcome {
                        address: r.get(1)?,
                        finished_at: from_unix_ms(r.get(2)?),
                        succeeded: r.get(3)?,
                    },
                ))
            })?
            .collect()
        })
        .await?;
    let own: Vec<(u64, String, i64)> = src
        .call(|c| {
            let mut stmt = c.prepare(
                "SELECT entry_idx, address, admitted_ms FROM remediation_entries \
                 ORDER BY entry_idx",
            )?;
            stmt.query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?))
            })?
            .collect()
        })
        .await?;
    let board = RemediationStore::switchboard(src).await?;

    let lines = journal.len() as u64;
    for chunk in journal.chunks(JOURNAL_BATCH) {
        let writes = chunk
            .iter()
            .map(|(seq, d)| JournalWrite::Insert {
                seq: *seq,
                decision: d.clone(),
            })
            .collect();
        dst.write_journal(writes).await?;
    }
    let switches = board.switches.len() as u64;
    for (key, (value, at_ms)) in board.switches {
        dst.set_switch(key, Some(value), at_ms).await?;
    }
    let cleared = board.cleared.len() as u64;
    for (address, at) in board.cleared {
        dst.clear_machine(address, to_unix_ms(at)).await?;
    }
    let n_outcomes = outcomes.len() as u64;
    if !outcomes.is_empty() {
        // Before 0: nothing is dropped.
        dst.add_outcomes(outcomes, 0).await?;
    }
    let n_own = own.len() as u64;
    for (index, address, at_ms) in own {
        dst.update_own_entries(vec![(index, address)], Vec::new(), at_ms)
            .await?;
    }
    Ok(Copied {
        area: REMEDIATION,
        items: lines + switches + cleared + n_outcomes + n_own,
        detail: format!(
            "{}, {}, {}, {}, {}",
            plural(lines, "journal line", "journal lines"),
            plural(switches, "switch", "switches"),
            plural(cleared, "cleared machine", "cleared machines"),
            plural(n_outcomes, "repair outcome", "repair outcomes"),
            plural(n_own, "own entry", "own entries"),
        ),
    })
}
