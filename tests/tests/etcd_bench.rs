//! The store benchmark of issue 30, both backends in one run: the repair queue at 10,000
//! entries on SQLite (on disk, as a coordinator opens it) and on a real etcd of the test
//! kit (one member, fsyncing as in production),
//! one commit per enqueue and per completion as the engine makes them, and the read a
//! remediation pass starts from (the whole queue). Numbers are printed, never asserted
//! (`docs/benchmarks.md`, "The store: SQLite and etcd").
//!
//! ```sh
//! cargo test --release --workspace --test etcd_bench -- --ignored --nocapture
//! BENCH_ENTRIES=2000 cargo test --release --workspace --test etcd_bench -- --ignored --nocapture
//! ```

use std::time::Instant;

use coordinator::repair::entry::{Entry, HistoryEvent};
use coordinator::repair::store::{RepairQueueStore, Write};
use coordinator::store::etcd::EtcdSettings;
use coordinator::store::{EtcdStore, Store};
use jiff::Timestamp;
use protocol::admin::repair::RepairStatus;
use testkit::etcd::{Etcd, Options, fresh_prefix};

fn entries() -> usize {
    std::env::var("BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
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
