//! The leader election and the fenced writes against a real etcd (v3.6, the test kit's
//! `testkit::etcd`): two campaigners and one leader; a leader whose lease goes (revoked, or
//! its process frozen past the TTL as SIGSTOP would) is succeeded with a higher epoch, and
//! its next write of every kind is refused as `Deposed` and lands nowhere; a leader that
//! loses etcd's quorum stops acting within the TTL.
//!
//! The campaigners are the coordinator's own `Candidate` and `keepalive::hold`, each with
//! its own etcd client, as two coordinator processes would have. Tests that only campaign
//! share one etcd (each under its own prefix); the quorum test starts a three-member
//! cluster of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator::ha::{Candidate, LEADER_KEY, Leadership, Role, RoleHandle, keepalive};
use coordinator::repair::entry::{Entry, HistoryEvent};
use coordinator::repair::store::{RepairQueueStore, Write};
use coordinator::store::etcd::fence::Term;
use coordinator::store::etcd::{EtcdError, EtcdSettings, EtcdStore, Sequence};
use coordinator::store::{Store, StoreError};
use testkit::etcd::{Etcd, Options, fresh_prefix, shared};
use tokio_util::sync::CancellationToken;

/// Every wait in these tests is bounded by this.
const BOUND: Duration = Duration::from_secs(30);

async fn connect(endpoints: Vec<String>, prefix: &str) -> EtcdStore {
    EtcdStore::connect(
        EtcdSettings::new(endpoints)
            .with_prefix(prefix)
            .with_request_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connect to the test etcd")
}

fn candidate(store: &EtcdStore, name: &str, ttl: Duration) -> Candidate {
    Candidate::new(
        store.clone(),
        name,
        format!("{name}.test:7400"),
        ttl,
        RoleHandle::elected(),
    )
}

/// Campaigns until it leads, within [`BOUND`].
async fn lead(c: &Candidate) -> Leadership {
    tokio::time::timeout(BOUND, c.campaign(&CancellationToken::new()))
        .await
        .expect("campaign within the bound")
        .expect("not stopped")
}

fn assert_deposed<T: std::fmt::Debug>(what: &str, r: Result<T, EtcdError>, epoch: i64) {
    match r {
        Err(EtcdError::Deposed { epoch: e, .. }) if e == epoch => {}
        other => panic!("{what}: expected Deposed at epoch {epoch}, got {other:?}"),
    }
}

/// Every kind of write a leader makes, through `store`; each must fail as Deposed.
async fn every_write_is_refused(store: &EtcdStore, epoch: i64) {
    let rev = store
        .kv_get::<u64>("things/a")
        .await
        .unwrap()
        .expect("written by the old leader")
        .mod_revision;
    assert_deposed("create", store.kv_create("things/new", &1u64).await, epoch);
    assert_deposed(
        "compare-and-swap",
        store.kv_put_if("things/a", &2u64, rev).await,
        epoch,
    );
    assert_deposed(
        "update",
        store
            .kv_update::<u64, _>("things/a", |v| v.map(|n| n + 1))
            .await,
        epoch,
    );
    assert_deposed(
        "transaction",
        store
            .txn()
            .put("things/b", &3u64)
            .unwrap()
            .delete("things/a")
            .commit()
            .await,
        epoch,
    );
    assert_deposed(
        "sequence append",
        Sequence::new("seq/index", "seq/items")
            .push(store, &4u64)
            .await,
        epoch,
    );
    assert_deposed(
        "directory delete",
        store.kv_delete_dir("things").await,
        epoch,
    );
    // The repair queue's own writes: an entry update (what CKE leaves unguarded) and an
    // enqueue.
    let queue = Store::from(store.clone());
    let (_, entries) = queue.load().await.unwrap();
    let mut e = entries.into_iter().next().expect("the old leader's entry");
    e.step = 5;
    let now = jiff::Timestamp::now();
    for (what, w) in [
        (
            "entry update",
            Write::Update(e.clone(), Some(HistoryEvent::new("x", "late"))),
        ),
        (
            "enqueue",
            Write::Insert(
                Entry::new_queued("10.0.0.9", "S9", "qemu", "op", now),
                HistoryEvent::new("added", "late"),
            ),
        ),
    ] {
        match queue.commit(vec![w], now).await {
            Err(StoreError::Etcd(EtcdError::Deposed { epoch: got, .. })) if got == epoch => {}
            other => panic!("{what}: expected Deposed at epoch {epoch}, got {other:?}"),
        }
    }
}

/// What the old leader wrote while it led, so its late writes have something to overwrite.
async fn write_as_leader(store: &EtcdStore) {
    assert!(store.kv_create("things/a", &1u64).await.unwrap());
    Sequence::new("seq/index", "seq/items")
        .push(store, &1u64)
        .await
        .unwrap();
    let now = jiff::Timestamp::now();
    Store::from(store.clone())
        .commit(
            vec![Write::Insert(
                Entry::new_queued("10.0.0.1", "S1", "qemu", "op", now),
                HistoryEvent::new("added", "test"),
            )],
            now,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn two_campaigners_one_leads_and_a_revoked_lease_hands_over_with_a_higher_epoch() {
    let etcd = shared().unwrap();
    let prefix = fresh_prefix("election");
    let (sa, sb) = (
        connect(etcd.endpoints(), &prefix).await,
        connect(etcd.endpoints(), &prefix).await,
    );
    let ttl = Duration::from_secs(4);
    let (a, b) = (candidate(&sa, "a", ttl), candidate(&sb, "b", ttl));
    let stop = CancellationToken::new();
    // Both campaign at once: exactly one leads, the other stands by naming it.
    let (ra, rb) = (a.role().clone(), b.role().clone());
    let ta = tokio::spawn({
        let (a, stop) = (a.clone(), stop.clone());
        async move { a.campaign(&stop).await }
    });
    let tb = tokio::spawn({
        let (b, stop) = (b.clone(), stop.clone());
        async move { b.campaign(&stop).await }
    });
    let started = Instant::now();
    while !(ra.is_leading() || rb.is_leading())
        || !matches!(ra.current(), Role::Leader { .. } | Role::Standby { .. })
        || !matches!(rb.current(), Role::Leader { .. } | Role::Standby { .. })
    {
        assert!(
            started.elapsed() < BOUND,
            "{:?} {:?}",
            ra.current(),
            rb.current()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        ra.is_leading() != rb.is_leading(),
        "exactly one leads: {:?} {:?}",
        ra.current(),
        rb.current()
    );
    let (won, lost_task, winner_role, loser_role, loser_name) = if ra.is_leading() {
        (ta.await.unwrap().unwrap(), tb, ra, rb, "b")
    } else {
        (tb.await.unwrap().unwrap(), ta, rb, ra, "a")
    };
    let Role::Standby {
        leader: Some(seen),
        epoch: Some(seen_epoch),
        ..
    } = loser_role.current()
    else {
        panic!(
            "the loser is a standby naming the leader: {:?}",
            loser_role.current()
        );
    };
    assert_eq!(seen_epoch, won.epoch);
    assert_eq!(seen.name, won.record.name);
    assert_ne!(seen.name, loser_name);
    // The key is JSON an operator can read, and its create revision is the epoch.
    let raw = sa
        .client()
        .clone()
        .get(sa.key(LEADER_KEY), None)
        .await
        .unwrap();
    let kv = &raw.kvs()[0];
    assert_eq!(kv.create_revision(), won.epoch);
    assert!(
        std::str::from_utf8(kv.value())
            .unwrap()
            .contains("\"address\"")
    );
    // The leader writes (fenced) and holds its lease for longer than the TTL.
    write_as_leader(&won.store).await;
    let holding = tokio::spawn({
        let (won, stop) = (won.clone(), stop.clone());
        async move { keepalive::hold(&won, &stop).await }
    });
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert!(
        winner_role.is_leading(),
        "keep-alives hold the lead past one TTL"
    );
    assert!(!lost_task.is_finished(), "the standby still waits");
    // A write whose own compare fails is not a deposal.
    assert!(!won.store.kv_create("things/a", &9u64).await.unwrap());
    // The lease revoked behind its back (as etcd does when it expires): the leader's term
    // ends (the watch sees the key go), the standby takes over with a higher epoch.
    let revoked = Instant::now();
    sa.client().clone().lease_revoke(won.lease).await.unwrap();
    let why = tokio::time::timeout(BOUND, holding)
        .await
        .expect("the leader noticed within the bound")
        .unwrap()
        .expect("the term ended");
    assert!(why.contains("leader key"), "{why}");
    assert!(!won.term.is_acting());
    let next = tokio::time::timeout(BOUND, lost_task)
        .await
        .expect("the standby took over within the bound")
        .unwrap()
        .expect("not stopped");
    assert!(
        revoked.elapsed() < ttl + Duration::from_secs(2),
        "takeover took {:?}",
        revoked.elapsed()
    );
    assert!(
        next.epoch > won.epoch,
        "epochs grow: {} then {}",
        won.epoch,
        next.epoch
    );
    assert!(loser_role.is_leading());
    // The old leader's handle, its term over: every write refused before it is sent.
    every_write_is_refused(&won.store, won.epoch).await;
    // An old leader that has not noticed yet (its term still valid in its own eyes): etcd's
    // compare on the leader key refuses every write, and ends its term.
    let unaware = Arc::new(Term::new(
        won.epoch,
        Instant::now() + Duration::from_secs(600),
    ));
    let late = sa.fenced(LEADER_KEY, unaware.clone());
    every_write_is_refused(&late, won.epoch).await;
    let why = unaware.why().expect("the refused compare ended the term");
    assert!(why.contains(&format!("epoch {}", next.epoch)), "{why}");
    // Nothing of them landed; the new leader writes.
    assert_eq!(
        next.store
            .kv_get::<u64>("things/a")
            .await
            .unwrap()
            .unwrap()
            .value,
        1
    );
    assert!(
        next.store
            .kv_get::<u64>("things/new")
            .await
            .unwrap()
            .is_none()
    );
    let (_, entries) = Store::from(next.store.clone()).load().await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].step, 0);
    assert!(
        next.store
            .kv_update::<u64, _>("things/a", |v| v.map(|n| n + 1))
            .await
            .unwrap()
            .is_some()
    );
    next.resign().await;
    stop.cancel();
}

#[test]
fn a_leader_frozen_past_its_ttl_is_succeeded_and_its_first_write_on_waking_is_refused() {
    let etcd = shared().unwrap();
    let prefix = fresh_prefix("frozen");
    let ttl = Duration::from_secs(3);
    let freeze = ttl + Duration::from_secs(2);
    let (tx, rx) = std::sync::mpsc::channel::<(&'static str, i64, Option<EtcdError>)>();
    let endpoints = etcd.endpoints();
    let old_prefix = prefix.clone();
    // The old leader runs alone on one thread's runtime; blocking that thread freezes all
    // of it (keep-alives, watch, timers), as SIGSTOP freezes a process.
    let frozen = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let s = connect(endpoints, &old_prefix).await;
            let c = candidate(&s, "old", ttl);
            let l = lead(&c).await;
            write_as_leader(&l.store).await;
            let stop = CancellationToken::new();
            let holding = tokio::spawn({
                let (l, stop) = (l.clone(), stop.clone());
                async move { keepalive::hold(&l, &stop).await }
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.send(("frozen", l.epoch, None)).unwrap();
            std::thread::sleep(freeze);
            // Awake: the very first thing it does is write, before its keep-alive loop runs.
            let woke = l.store.kv_put_if("things/a", &100u64, 0).await;
            tx.send(("woke", l.epoch, woke.err())).unwrap();
            let why = tokio::time::timeout(BOUND, holding).await;
            assert!(matches!(why, Ok(Ok(Some(_)))), "{why:?}");
            assert!(!c.role().is_leading());
        });
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (what, old_epoch, _) = rx.recv_timeout(BOUND).unwrap();
        assert_eq!(what, "frozen");
        let froze = Instant::now();
        let s = connect(etcd.endpoints(), &prefix).await;
        let next = lead(&candidate(&s, "new", ttl)).await;
        assert!(next.epoch > old_epoch);
        assert!(
            froze.elapsed() < ttl + Duration::from_secs(2),
            "takeover {:?} after the freeze",
            froze.elapsed()
        );
        let (what, _, err) = rx.recv_timeout(BOUND).unwrap();
        assert_eq!(what, "woke");
        match err {
            Some(EtcdError::Deposed { epoch, why, .. }) if epoch == old_epoch => {
                assert!(why.contains("keep-alive"), "{why}")
            }
            other => panic!("the woken leader's write: {other:?}"),
        }
        assert_eq!(
            next.store
                .kv_get::<u64>("things/a")
                .await
                .unwrap()
                .unwrap()
                .value,
            1,
            "the woken leader's write landed"
        );
        next.resign().await;
    });
    frozen.join().unwrap();
}

#[tokio::test]
async fn a_leader_that_loses_etcds_quorum_stops_acting_within_its_ttl() {
    let mut etcd = tokio::task::spawn_blocking(|| Etcd::start(Options::cluster(3)))
        .await
        .unwrap()
        .unwrap();
    let prefix = fresh_prefix("quorum");
    let s = connect(etcd.endpoints(), &prefix).await;
    let ttl = Duration::from_secs(3);
    let c = candidate(&s, "a", ttl);
    let l = lead(&c).await;
    write_as_leader(&l.store).await;
    let stop = CancellationToken::new();
    let holding = tokio::spawn({
        let (l, stop) = (l.clone(), stop.clone());
        async move { keepalive::hold(&l, &stop).await }
    });
    tokio::time::sleep(ttl).await;
    assert!(c.role().is_leading());
    // Two of three members gone: no quorum, no keep-alive answered.
    let cut = Instant::now();
    etcd.kill(1);
    etcd.kill(2);
    let why = tokio::time::timeout(BOUND, holding)
        .await
        .expect("the term ended within the bound")
        .unwrap()
        .expect("not stopped");
    let took = cut.elapsed();
    // The surviving member, if it led, answers keep-alives until it notices the lost quorum
    // (etcd's election timeout, 1 s by default); the term then lasts one TTL from the last
    // keep-alive it answered, and not a moment longer.
    assert!(
        l.term.valid_until() <= cut + ttl + Duration::from_millis(1500),
        "a keep-alive was answered {:?} after the quorum was lost",
        (l.term.valid_until() - ttl).saturating_duration_since(cut)
    );
    assert!(
        took <= ttl + Duration::from_millis(2000),
        "stopped acting {took:?} after the quorum was lost (TTL {ttl:?}): {why}"
    );
    assert!(!c.role().is_leading());
    assert_deposed(
        "write without quorum",
        l.store.kv_create("things/x", &1u64).await,
        l.epoch,
    );
    // Quorum back: one leader again, with a higher epoch, and nothing lost.
    let _etcd = tokio::task::spawn_blocking(move || {
        etcd.restart(1).unwrap();
        etcd.restart(2).unwrap();
        etcd
    })
    .await
    .unwrap();
    let again = lead(&candidate(&s, "a2", ttl)).await;
    assert!(again.epoch > l.epoch);
    assert_eq!(
        again
            .store
            .kv_get::<u64>("things/a")
            .await
            .unwrap()
            .unwrap()
            .value,
        1
    );
    stop.cancel();
}

/// A leader's write waiting out an etcd election (refused for want of a leader and sent
/// again) is not sent again once the leader's term ends meanwhile: it fails as Deposed at
/// once instead of going on until its timeout.
#[tokio::test]
async fn a_write_waiting_for_an_etcd_leader_is_not_sent_again_once_the_term_ends() {
    let mut etcd = tokio::task::spawn_blocking(|| Etcd::start(Options::cluster(3)))
        .await
        .unwrap()
        .unwrap();
    let s = connect(etcd.endpoints(), &fresh_prefix("waiting")).await;
    let l = lead(&candidate(&s, "a", Duration::from_secs(30))).await;
    // Quorum lost: the member the store uses (the first) answers "no leader" once it sees.
    etcd.kill(1);
    etcd.kill(2);
    let deadline = Instant::now() + BOUND;
    loop {
        match s.probe_quorum().await {
            Err(e) if e.to_string().contains("no leader") => break,
            other => assert!(Instant::now() < deadline, "never \"no leader\": {other:?}"),
        }
    }
    let store = l.store.clone();
    let write = tokio::spawn(async move { store.kv_create("things/x", &1u64).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    l.term.end("the test ended the term");
    let r = tokio::time::timeout(Duration::from_millis(500), write)
        .await
        .expect("the write ended with the term, not at its 2 s timeout")
        .unwrap();
    assert_deposed("a write waiting for a leader", r, l.epoch);
}

/// The coordinator's path: campaign and hold; the lease lost, the role turns deposed, the
/// running repair command's process group is killed and the token the coordinator stops on
/// fires; a clean stop resigns, so a standby leads at once.
#[tokio::test]
async fn a_lost_lease_marks_the_role_deposed_kills_running_commands_and_fires_the_stop_and_a_clean_stop_resigns()
 {
    use coordinator::ha::campaign_and_hold;
    let etcd = shared().unwrap();
    let prefix = fresh_prefix("lead");
    let s = connect(etcd.endpoints(), &prefix).await;
    let ttl = Duration::from_secs(10);
    let c = candidate(&s, "a", ttl);
    let (stop, lost) = (CancellationToken::new(), CancellationToken::new());
    let (l, holder) = campaign_and_hold(&c, &stop, stop.clone(), lost.clone())
        .await
        .unwrap();
    assert!(c.role().is_leading());
    // A repair command running for the leader (nothing else in this test binary runs one).
    let pidfile = tempfile::NamedTempFile::new().unwrap();
    let argv: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        format!("echo $$ > {}; exec sleep 60", pidfile.path().display()),
    ];
    let command = tokio::spawn(async move {
        coordinator::repair::command::run_external(&argv, Some(BOUND * 2), None).await
    });
    let started = Instant::now();
    while std::fs::read_to_string(pidfile.path())
        .unwrap()
        .trim()
        .is_empty()
    {
        assert!(started.elapsed() < BOUND, "the command did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.client().clone().lease_revoke(l.lease).await.unwrap();
    tokio::time::timeout(BOUND, lost.cancelled())
        .await
        .expect("the stop token fired");
    holder.await.unwrap();
    // Its process group was killed at the deposal, not at its 60 s end.
    let (end, _) = tokio::time::timeout(Duration::from_secs(5), command)
        .await
        .expect("the command ended at the deposal")
        .unwrap();
    assert!(!end.ok, "{end:?}");
    let pid = std::fs::read_to_string(pidfile.path()).unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "the command's process {} still runs",
        pid.trim()
    );
    let Role::Deposed { epoch, why, .. } = c.role().current() else {
        panic!("{:?}", c.role().current())
    };
    assert_eq!(epoch, l.epoch);
    assert!(why.contains("leader key"), "{why}");
    // A clean stop gives the key up: the next candidate leads well within the 10 s TTL.
    let c2 = candidate(&s, "b", ttl);
    let (stop2, lost2) = (CancellationToken::new(), CancellationToken::new());
    let (l2, holder2) = campaign_and_hold(&c2, &stop2, stop2.clone(), lost2.clone())
        .await
        .unwrap();
    stop2.cancel();
    holder2.await.unwrap();
    assert!(!lost2.is_cancelled(), "a clean stop is not a deposal");
    let resigned = Instant::now();
    let c3 = candidate(&s, "c", ttl);
    let l3 = lead(&c3).await;
    assert!(
        resigned.elapsed() < Duration::from_secs(2),
        "took over {:?} after a resignation",
        resigned.elapsed()
    );
    assert!(l3.epoch > l2.epoch);
    l3.resign().await;
}
