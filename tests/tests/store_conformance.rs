//! One store conformance suite, two backends: every test body here runs once against SQLite
//! on disk and once against a real etcd (the test kit's, one per test binary, a fresh key
//! prefix per test), through the same `coordinator::store::Store` the coordinator holds.
//!
//! The bodies are the areas' own conformance tests (`repair::store::conformance`,
//! `fence::store::conformance`, public under the coordinator's `testing` feature) and a few
//! written here for what both backends must do alike: the store identity, the health probe,
//! the pruning of old finished fence flows, and the kdump area's own test; machine records,
//! command process groups, diagnostics bundles and the remediation journal run their areas'
//! bodies, and one batch of machines larger than an etcd transaction. A backend that passes these is a store the
//! coordinator can run on.

use std::collections::HashSet;

use coordinator::fence::flow::{Flow, State};
use coordinator::fence::store::{FenceStore, KEPT_FINISHED_PER_MACHINE};
use coordinator::repair::entry::{Entry, HistoryEvent};
use coordinator::repair::store::{RepairQueueStore, Write};
use coordinator::store::etcd::EtcdSettings;
use coordinator::store::{EtcdStore, IdentityStore, Probe, Store};
use jiff::Timestamp;
use testkit::etcd::{fresh_prefix, shared};

/// What keeps a backend alive while its store is used: the SQLite file's directory, or the
/// shared etcd.
type Keep = Box<dyn std::any::Any>;

async fn sqlite() -> (Keep, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("c.db")).unwrap();
    (Box::new(dir), store)
}

async fn etcd() -> (Keep, Store) {
    let etcd = shared().unwrap();
    let store = EtcdStore::connect(
        EtcdSettings::new(etcd.endpoints()).with_prefix(fresh_prefix("conformance")),
    )
    .await
    .unwrap();
    (Box::new(etcd), Store::from(store))
}

/// `name => body` runs `body(&Store)` as `sqlite::name` and `etcd::name`.
macro_rules! conformance {
    ($($name:ident => $body:path),* $(,)?) => {
        mod sqlite_store {
            $(
                #[tokio::test]
                async fn $name() {
                    let (_keep, store) = super::sqlite().await;
                    $body(&store).await;
                }
            )*
        }
        mod etcd_store {
            $(
                #[tokio::test]
                async fn $name() {
                    let (_keep, store) = super::etcd().await;
                    $body(&store).await;
                }
            )*
        }
    };
}

conformance! {
    repair_entries_round_trip_and_indexes_are_never_reused =>
        coordinator::repair::store::conformance::entries_round_trip_and_indexes_are_never_reused,
    repair_batch_inserts_number_in_order_and_disable_survives_reload =>
        super::repair_batch_inserts_number_in_order,
    fence_flow_round_trips_with_its_history =>
        coordinator::fence::store::conformance::a_flow_round_trips_with_its_history,
    fence_finished_flows_are_pruned_to_the_newest_kept =>
        super::fence_finished_flows_are_pruned,
    identity_is_made_once_and_probe_passes => super::identity_and_probe,
    kdump_the_next_notice_replaces_the_last =>
        coordinator::kdump::store::conformance::the_next_notice_replaces_the_last,
    machines_round_trip => coordinator::fleet::store::conformance::machines_round_trip,
    machines_keep_their_newest_transitions_only =>
        coordinator::fleet::store::conformance::each_machine_keeps_its_newest_transitions_only,
    machines_many_in_one_batch =>
        coordinator::fleet::store::conformance::many_machines_in_one_batch,
    command_groups_are_recorded_forgotten_and_reaped =>
        coordinator::repair::store::groups::conformance::groups_are_recorded_forgotten_and_reaped,
    diagnostics_kept_replaced_and_bounded =>
        coordinator::repair::store::diagnostics::conformance::kept_listed_replaced_on_resend_and_bounded_per_machine,
    diagnostics_at_the_agents_limit_are_kept_whole =>
        coordinator::repair::store::diagnostics::conformance::bundles_at_the_agents_limit_are_kept_whole,
    remediation_switches_outcomes_and_own_entries =>
        coordinator::remediation::store::conformance::switches_outcomes_and_own_entries,
    remediation_journal_lines_repeat_query_resume_and_prune =>
        coordinator::remediation::store::conformance::journal_lines_repeat_query_resume_and_prune,
}

fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

async fn repair_batch_inserts_number_in_order(s: &Store) {
    let now = t0();
    let (enabled, none) = RepairQueueStore::load(s).await.unwrap();
    assert!(enabled, "a new queue is enabled");
    assert!(none.is_empty());
    let writes: Vec<Write> = (0..20)
        .map(|i| {
            Write::Insert(
                Entry::new_queued(&format!("10.0.1.{i}"), "S", "qemu", "op", now),
                HistoryEvent::new("added", "test"),
            )
        })
        .collect();
    let ids = s.commit(writes, now).await.unwrap();
    assert_eq!(ids, (1..=20).collect::<Vec<u64>>());
    let (_, all) = RepairQueueStore::load(s).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.index).collect::<Vec<_>>(),
        ids,
        "loaded by index"
    );
    assert_eq!(all[4].address, "10.0.1.4");
    s.commit(vec![Write::SetEnabled(false)], now).await.unwrap();
    s.commit(
        vec![Write::History(
            all[0].clone(),
            HistoryEvent::new("note", "n"),
        )],
        now,
    )
    .await
    .unwrap();
    assert!(!RepairQueueStore::load(s).await.unwrap().0);
    assert_eq!(RepairQueueStore::history(s, 1).await.unwrap().len(), 2);
    assert_eq!(s.active_addresses().await.unwrap().len(), 20);
    let mut marked = all[0].clone();
    marked.deleted = true;
    s.commit(vec![Write::Update(marked, None)], now)
        .await
        .unwrap();
    let active: HashSet<String> = s.active_addresses().await.unwrap();
    assert!(
        !active.contains("10.0.1.0"),
        "an entry marked deleted is not active"
    );
}

async fn fence_finished_flows_are_pruned(s: &Store) {
    let now = t0();
    let n = KEPT_FINISHED_PER_MACHINE as u64 + 3;
    let mut ids = Vec::new();
    for i in 0..n {
        let f = Flow::new("10.0.2.1", "S", "n1", None, false, now);
        let mut f = f.clone();
        f.id = s
            .start(f.clone(), format!("start {i}"), now)
            .await
            .unwrap()
            .expect("no unfinished flow blocks it");
        f.state = State::Done;
        s.update(f.clone(), "done".into(), now).await.unwrap();
        ids.push(f.id);
    }
    // Another machine's flow, unfinished, is not touched.
    let other = Flow::new("10.0.2.2", "S", "n2", None, false, now);
    let other_id = s.start(other, "start".into(), now).await.unwrap().unwrap();
    let kept: Vec<u64> = s
        .list_for("10.0.2.1".into(), 1000)
        .await
        .unwrap()
        .iter()
        .map(|f| f.id)
        .collect();
    let newest: Vec<u64> = ids
        .iter()
        .rev()
        .take(KEPT_FINISHED_PER_MACHINE as usize)
        .copied()
        .collect();
    assert_eq!(
        kept, newest,
        "the newest {KEPT_FINISHED_PER_MACHINE}, newest first"
    );
    assert!(
        FenceStore::load(s, ids[0]).await.unwrap().is_none(),
        "the oldest is gone"
    );
    assert!(
        FenceStore::history(s, ids[0]).await.unwrap().is_empty(),
        "with its history"
    );
    assert_eq!(s.unfinished().await.unwrap().len(), 1);
    assert_eq!(s.unfinished().await.unwrap()[0].id, other_id);
    assert_eq!(s.list(3).await.unwrap()[0].id, other_id, "newest first");
}

async fn identity_and_probe(s: &Store) {
    let id = s.identity().await.unwrap();
    assert_eq!(id.len(), 32);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(s.identity().await.unwrap(), id);
    s.probe().await.unwrap();
    s.ping().await.unwrap();
    assert_eq!(s.health().failing(), None);
}
