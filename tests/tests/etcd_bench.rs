//! The store benchmark of issue 30, both backends in one run: the repair queue at 10,000
//! entries on SQLite (on disk, as a coordinator opens it) and on a real etcd of the test
//! kit (one member, fsyncing as in production),
//! one commit per enqueue and per completion as the engine makes them, and the read a
//! remediation pass starts from (the whole queue); then what a remediation pass and a
//! coordinator's start read of the store at 10,000 machines (the machine records, the
//! operator's switches) and the decision journal's reads at 20,000 lines (`events`, its
//! `events --follow` poll, the loop's resume and its minute's pruning). Numbers are printed, never
//! asserted (`docs/benchmarks.md`, "The store: SQLite and etcd").
//!
//! ```sh
//! cargo test --release --workspace --test etcd_bench -- --ignored --nocapture
//! BENCH_ENTRIES=2000 cargo test --release --workspace --test etcd_bench -- --ignored --nocapture
//! cargo test --workspace --test etcd_bench -- --ignored --nocapture remediation_input
//! ```

use std::time::Instant;

use coordinator::repair::entry::{Entry, HistoryEvent};
use coordinator::repair::store::{RepairQueueStore, Write};
use coordinator::store::etcd::EtcdSettings;
use coordinator::store::{EtcdStore, Store};
use jiff::Timestamp;
use protocol::admin::repair::RepairStatus;
use testkit::etcd::{Etcd, Options, fresh_prefix};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn entries() -> usize {
    env_or("BENCH_ENTRIES", 10_000)
}

/// Enqueues `n` entries one commit each, completes each one commit each, and loads the
/// queue; prints the rates.
async fn run(name: &str, store: &Store, n: usize) {
    let now = Timestamp::now();
    let start = Instant::now();
    let mut added = Vec::with_capacity(n);
    for i in 0..n {
        let a = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
        let e = Entry::new_queued(&a, "S", "qemu", "unreachable", now);
        let ids = store
            .commit(
                vec![Write::Insert(
                    e.clone(),
                    HistoryEvent::new("added", "bench"),
                )],
                now,
            )
            .await
            .unwrap();
        let mut e = e;
        e.index = ids[0];
        added.push(e);
    }
    let enqueue = start.elapsed();

    let start = Instant::now();
    let (_, loaded) = store.load().await.unwrap();
    let load = start.elapsed();
    assert_eq!(loaded.len(), n);
    let start = Instant::now();
    let active = store.active_addresses().await.unwrap();
    let active_t = start.elapsed();
    assert_eq!(active.len(), n);

    let start = Instant::now();
    for mut e in added {
        e.status = RepairStatus::Succeeded;
        store
            .commit(
                vec![Write::Update(
                    e,
                    Some(HistoryEvent::new("succeeded", "bench")),
                )],
                now,
            )
            .await
            .unwrap();
    }
    let complete = start.elapsed();
    let rate = |d: std::time::Duration| n as f64 / d.as_secs_f64();
    println!(
        "{name:7} {n} entries: enqueue {:8.0}/s ({:6.1} s), complete {:8.0}/s ({:6.1} s), \
         load the queue {:6.0} ms, active addresses {:6.0} ms",
        rate(enqueue),
        enqueue.as_secs_f64(),
        rate(complete),
        complete.as_secs_f64(),
        load.as_secs_f64() * 1000.0,
        active_t.as_secs_f64() * 1000.0,
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn repair_queue_on_sqlite_and_etcd() {
    let n = entries();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::open_exclusive(&dir.path().join("coordinator.db")).unwrap();
    run("sqlite", &sqlite, n).await;
    // Its own member, fsyncing every commit as in production (the kit's shared one does not).
    let etcd = Etcd::start(Options::default().durable()).unwrap();
    let store =
        EtcdStore::connect(EtcdSettings::new(etcd.endpoints()).with_prefix(fresh_prefix("bench")))
            .await
            .unwrap();
    run("etcd", &Store::from(store), n).await;
}

/// The median of `runs` timings of `f`, in milliseconds.
async fn median_ms<F, Fut, T>(runs: usize, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        std::hint::black_box(f().await);
        t.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// What a pass and a start read of the store at `machines` machines, and the journal's reads
/// at `lines` lines (a tenth of the machines each with a line repeated every pass).
async fn remediation_input(name: &str, store: &Store, machines: usize, lines: usize) {
    use coordinator::fleet::store::bench;
    use coordinator::remediation::decision::{Decision, Outcome, Rule};
    use coordinator::remediation::journal::JournalWrite;
    use coordinator::remediation::store::RemediationStore;
    use protocol::admin::remediation::EventsQuery;

    let now = Timestamp::now();
    let start = Instant::now();
    bench::fill(store, machines).await.unwrap();
    let persist = start.elapsed();
    assert_eq!(bench::read_all(store).await.unwrap(), machines);
    let load = median_ms(5, || bench::read_all(store)).await;
    let board = median_ms(21, || store.switchboard()).await;

    // The journal: `lines` lines written as passes of 100 new lines each.
    let d = |i: usize| Decision {
        at: now,
        address: format!("10.0.{}.{}", (i / 256) % 256, i % 256),
        domain: "rack-1".into(),
        outcome: Outcome::Held,
        rule: Rule::NeedsHuman,
        proposal: None,
        sentence: format!("held: machine {i} needs a human"),
    };
    let start = Instant::now();
    let mut seq = 0u64;
    for pass in 0..lines.div_ceil(100) {
        let writes = (0..100)
            .map(|k| {
                seq += 1;
                JournalWrite::Insert {
                    seq,
                    decision: d(pass * 100 + k),
                }
            })
            .collect();
        store.write_journal(writes).await.unwrap();
    }
    let write = start.elapsed();
    let events = median_ms(5, || store.events(EventsQuery::default())).await;
    let watch = median_ms(21, || {
        store.events(EventsQuery {
            after_seq: Some(seq),
            ..Default::default()
        })
    })
    .await;
    let resume = median_ms(5, || store.resume(0, 0, 0)).await;
    let prune = median_ms(5, || store.prune_journal(0, u64::MAX)).await;
    println!(
        "{name:7} {machines} machines: persist {:6.1} s, read all (a start) {load:7.1} ms, \
         switches (each pass) {board:6.2} ms; {lines} journal lines: written {:5.1} s, \
         events (1,000 newest) {events:7.1} ms, an events --follow poll {watch:6.2} ms, \
         resume {resume:7.1} ms, a minute's pruning (nothing to prune) {prune:7.1} ms",
        persist.as_secs_f64(),
        write.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn remediation_input_on_sqlite_and_etcd() {
    let machines = env_or("BENCH_MACHINES", 10_000);
    let lines = env_or("BENCH_LINES", 20_000);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::open_exclusive(&dir.path().join("coordinator.db")).unwrap();
    remediation_input("sqlite", &sqlite, machines, lines).await;
    let etcd = Etcd::start(Options::default().durable()).unwrap();
    let store =
        EtcdStore::connect(EtcdSettings::new(etcd.endpoints()).with_prefix(fresh_prefix("input")))
            .await
            .unwrap();
    remediation_input("etcd", &Store::from(store), machines, lines).await;
}
