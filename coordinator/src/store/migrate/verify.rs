//! What a store holds, area by area, read through the areas' traits alone: the same reads
//! on either backend, so two stores that hold the same state give the same lines.
//! `coordinator migrate` compares the SQLite store with its copy this way before it calls
//! the copy done, and the tests compare with it too.
//!
//! Each area is a list of lines (the `Debug` form of what its trait returns, in a fixed
//! order). Not here: what the copy does not keep by design: the identity (new on purpose),
//! and a journal line's first time and repeat count (the trait writes a line once).

use std::collections::{BTreeMap, BTreeSet};

use protocol::admin::remediation::EventsQuery;

use super::areas::{DIAGNOSTICS, FENCE, GROUPS, KDUMP, MACHINES, REMEDIATION, REPAIR};
use crate::fence::store::FenceStore;
use crate::fleet::store::{KEEP_TRANSITIONS, MachineStore};
use crate::kdump::store::KdumpStore;
use crate::remediation::store::RemediationStore;
use crate::repair::store::RepairQueueStore;
use crate::repair::store::diagnostics::DiagnosticsStore;
use crate::repair::store::groups::CommandGroupStore;
use crate::store::{Store, StoreError};

/// A store's content: area → its lines, or `None` when this backend cannot keep the area
/// yet (an etcd driver not written).
pub type Dump = BTreeMap<&'static str, Option<Vec<String>>>;

/// Every backend has every area today; an area added to one backend before the other
/// answers `Ok(None)` here, so that a copy holding nothing of it still compares equal.
fn have<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    r.map(Some)
}

fn lines<T: std::fmt::Debug>(items: impl IntoIterator<Item = T>) -> Vec<String> {
    items.into_iter().map(|i| format!("{i:?}")).collect()
}

/// Reads every area of `store`.
pub async fn dump(store: &Store) -> Result<Dump, StoreError> {
    let mut out = Dump::new();
    let mut addresses = BTreeSet::new();

    let machines = match have(MachineStore::machines(store).await)? {
        None => None,
        Some(all) => {
            let mut l = Vec::new();
            for m in all {
                addresses.insert(m.record.address.clone());
                l.push(format!(
                    "{:?} {} since {} ({}) boot {:?}",
                    m.record, m.state, m.since, m.reason, m.boot_id
                ));
                let t = store
                    .transitions(m.record.address.clone(), KEEP_TRANSITIONS)
                    .await?;
                l.extend(lines(t));
            }
            Some(l)
        }
    };
    out.insert(MACHINES, machines);

    let (enabled, entries) = RepairQueueStore::load(store).await?;
    let mut repair = vec![format!("enabled {enabled}")];
    for e in entries {
        addresses.insert(e.address.clone());
        let h = RepairQueueStore::history(store, e.index).await?;
        repair.push(format!("{e:?}"));
        repair.extend(lines(h));
    }
    out.insert(REPAIR, Some(repair));

    let mut fence = Vec::new();
    for f in store.list(u32::MAX).await? {
        let h = FenceStore::history(store, f.id).await?;
        fence.push(format!("{f:?}"));
        fence.extend(lines(h));
    }
    out.insert(FENCE, Some(fence));

    out.insert(KDUMP, Some(lines(store.notices().await?)));

    let mut diagnostics = Some(Vec::new());
    for a in &addresses {
        match have(store.bundles_of(a.clone()).await)? {
            None => {
                diagnostics = None;
                break;
            }
            Some(list) => {
                for s in list {
                    let full = store.bundle(a.clone(), Some(s.id)).await?;
                    if let Some(l) = diagnostics.as_mut() {
                        l.push(format!("{full:?}"));
                    }
                }
            }
        }
    }
    out.insert(DIAGNOSTICS, diagnostics);

    out.insert(
        GROUPS,
        have(store.groups().await)?.map(|g| {
            let mut l = lines(g);
            l.sort();
            l
        }),
    );

    let remediation = match have(store.switchboard().await)? {
        None => None,
        Some(board) => {
            let mut l = vec![format!("{board:?}")];
            let events = store
                .events(EventsQuery {
                    machine: None,
                    since_unix_ms: None,
                    after_seq: None,
                    limit: u32::MAX,
                })
                .await?;
            l.extend(events.into_iter().map(|e| {
                format!(
                    "#{} at {} {} {} {} {} {:?} {}",
                    e.seq,
                    e.last_unix_ms,
                    e.address,
                    e.domain,
                    e.outcome,
                    e.rule,
                    e.operation,
                    e.sentence
                )
            }));
            let r = store.resume(0, 0, 0).await?;
            l.push(format!("max seq {}", r.max_seq));
            l.extend(lines(r.admissions));
            l.extend(lines(r.outcomes));
            l.extend(lines(r.own_entries));
            Some(l)
        }
    };
    out.insert(REMEDIATION, remediation);
    Ok(out)
}

/// The first difference between a source and its copy, as a sentence; `None` when they
/// agree. An area the copy's backend cannot keep yet agrees only when the source holds
/// nothing in it (`empty`).
pub fn difference(source: &Dump, copy: &Dump, empty: &BTreeSet<&'static str>) -> Option<String> {
    for (area, want) in source {
        let got = copy.get(area).cloned().flatten();
        match (want, got) {
            (Some(w), Some(g)) => {
                if let Some(i) = (0..w.len().max(g.len())).find(|&i| w.get(i) != g.get(i)) {
                    return Some(format!(
                        "{area}: line {}: the SQLite store has {:?}, etcd has {:?}",
                        i + 1,
                        w.get(i),
                        g.get(i)
                    ));
                }
            }
            (_, None) if empty.contains(area) => {}
            (_, None) => {
                return Some(format!(
                    "{area}: the SQLite store holds some, and this build cannot keep them on etcd"
                ));
            }
            (None, Some(_)) => {}
        }
    }
    None
}
