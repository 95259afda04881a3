//! `coordinator migrate --from-sqlite FILE`, run as an operator runs it (the real binary,
//! a SQLite store on disk, the test kit's real etcd): every row of the source is in etcd
//! afterwards (both stores read back area by area through the same traits and compared),
//! entries and flows keep their indexes, the etcd store gets an identity of its own, a
//! non-empty target and a locked source are refused, and a copy killed halfway is refused
//! by a starting coordinator and finished by a rerun.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use coordinator::fence::flow::{Flow, State};
use coordinator::fence::store::FenceStore;
use coordinator::kdump::KdumpRecord;
use coordinator::kdump::store::KdumpStore;
use coordinator::repair::entry::{Entry, HistoryEvent};
use coordinator::repair::store::{RepairQueueStore, Write};
use coordinator::store::etcd::{EtcdError, EtcdSettings};
use coordinator::store::migrate::{difference, dump};
use coordinator::store::{EtcdStore, IdentityStore, Store};
use jiff::Timestamp;
use protocol::messages::KdumpPhase;
use testkit::etcd::{fresh_prefix, shared};
use testkit::procs::{Pki, command};

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

/// A SQLite store with a deleted entry, an entry in progress with history, a queued one,
/// the queue disabled, a finished and an unfinished fence flow with a step link, and a
/// kdump notice.
async fn fill(store: &Store) {
    let e = |a: &str| Entry::new_queued(a, "S", "qemu", "unreachable", t(0));
    let ids = store
        .commit(
            vec![
                Write::Insert(e("10.0.0.1"), HistoryEvent::new("added", "test")),
                Write::Insert(e("10.0.0.2"), HistoryEvent::new("added", "test")),
                Write::Insert(e("10.0.0.3"), HistoryEvent::new("added", "test")),
            ],
            t(1),
        )
        .await
        .unwrap();
    assert_eq!(ids, [1, 2, 3]);
    let mut two = e("10.0.0.2");
    two.index = 2;
    two.status = protocol::admin::repair::RepairStatus::Processing;
    two.step = 1;
    let mut three = e("10.0.0.3");
    three.index = 3;
    store
        .commit(
            vec![
                Write::Delete(1),
                Write::Update(
                    two,
                    Some(HistoryEvent::new("step", "power off").with_output("ok")),
                ),
                Write::History(three, HistoryEvent::new("note", "waiting")),
                Write::SetEnabled(false),
            ],
            t(2),
        )
        .await
        .unwrap();
    let mut f = Flow::new("10.0.0.2", "S", "n2", Some("b1".into()), false, t(3));
    f.id = store
        .start(f.clone(), "started".into(), t(3))
        .await
        .unwrap()
        .unwrap();
    f.state = State::Done;
    f.confirmed_off = Some(t(4));
    store.update(f.clone(), "done".into(), t(4)).await.unwrap();
    let mut g = Flow::new("10.0.0.2", "S", "n2", None, true, t(5));
    g.id = store
        .start(g.clone(), "started".into(), t(5))
        .await
        .unwrap()
        .unwrap();
    g.state = State::WaitReleased;
    g.confirmed_off = Some(t(6));
    store.update(g.clone(), "off".into(), t(6)).await.unwrap();
    store
        .link_step(format!("2/1/{}", g.id), 2, g.id, t(6))
        .await
        .unwrap();
    store
        .save_notice(
            "10.0.0.3".into(),
            KdumpRecord {
                phase: KdumpPhase::Start,
                started: Some(t(7)),
                done: None,
                boot_id: Some("crashed".into()),
                node_time: t(7),
            },
            t(7),
        )
        .await
        .unwrap();
}

/// A coordinator configuration whose `[store]` is the shared etcd under `prefix` (the
/// caller holds the shared etcd: it stops with its last holder).
fn config(dir: &Path, pki: &Pki, prefix: &str) -> anyhow::Result<PathBuf> {
    let name: String = prefix
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let tls = pki.issue("coordinator", &name, &[])?;
    let etcd = shared()?;
    let q = |p: &Path| format!("{:?}", p.to_string_lossy());
    let path = dir.join(format!("c{}.toml", prefix.replace('/', "_")));
    std::fs::write(
        &path,
        format!(
            "name = \"coord\"\nlisten = \"127.0.0.1:1\"\ndatabase = {}\n\n[tls]\nca = {}\ncert = {}\nkey = {}\n\n[store]\nbackend = \"etcd\"\nendpoints = {:?}\nprefix = \"{prefix}/\"\n",
            q(&dir.join("unused.db")),
            q(&tls.ca),
            q(&tls.cert),
            q(&tls.key),
            etcd.endpoints(),
        ),
    )?;
    Ok(path)
}

fn migrate(cfg: &Path, db: &Path, json: bool) -> anyhow::Result<Output> {
    let mut cmd = command("coordinator");
    cmd.arg("--config")
        .arg(cfg)
        .args(["migrate", "--from-sqlite"])
        .arg(db);
    if json {
        cmd.arg("--json");
    }
    Ok(cmd.output()?)
}

async fn etcd_store(prefix: &str) -> Result<EtcdStore, EtcdError> {
    EtcdStore::connect(EtcdSettings::new(shared().unwrap().endpoints()).with_prefix(prefix)).await
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_with_entries_flows_and_notices_moves_to_etcd_whole() -> anyhow::Result<()> {
    let _etcd = shared()?;
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let db = tmp.path().join("coordinator.db");
    let source = Store::open(&db)?;
    fill(&source).await;
    let source_id = source.identity().await?;
    let prefix = fresh_prefix("migrate");
    let cfg = config(tmp.path(), &pki, &prefix)?;

    let out = migrate(&cfg, &db, true)?;
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let items = |area: &str| {
        report["areas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["area"] == area)
            .map(|a| a["items"].as_u64().unwrap())
    };
    assert_eq!(items("repair queue"), Some(2), "{report}");
    assert_eq!(items("fence flows"), Some(2), "{report}");
    assert_eq!(items("kdump notices"), Some(1), "{report}");
    assert_eq!(report["source_store_id"], source_id.as_str());

    // Every area, read back through the same traits on both backends.
    let etcd = etcd_store(&prefix).await?;
    let copy = Store::from(etcd.clone());
    let want = dump(&source).await?;
    let got = dump(&copy).await?;
    let empty: BTreeSet<&str> = ["machines", "diagnostics", "command groups", "remediation"].into();
    assert_eq!(difference(&want, &got, &empty), None);
    assert_eq!(want["repair queue"], got["repair queue"]);
    assert!(want["repair queue"].as_ref().unwrap().len() > 4);

    // A new identity, told in the report; indexes and ids go on from the source's.
    let id = copy.identity().await?;
    assert_ne!(
        id, source_id,
        "the copy must not send the source's request ids"
    );
    assert_eq!(report["store_id"], id.as_str());
    let (enabled, entries) = RepairQueueStore::load(&copy).await?;
    assert!(!enabled);
    assert_eq!(entries.iter().map(|e| e.index).collect::<Vec<_>>(), [2, 3]);
    let next = copy
        .commit(
            vec![Write::Insert(
                Entry::new_queued("10.0.0.9", "S", "qemu", "op", t(9)),
                HistoryEvent::new("added", ""),
            )],
            t(9),
        )
        .await?;
    assert_eq!(next, [4], "index 1 (deleted) and 3 are never given again");
    let unfinished = copy.unfinished().await?;
    assert_eq!(unfinished.len(), 1);
    assert_eq!(
        copy.flow_of_step(format!("2/1/{}", unfinished[0].id))
            .await?,
        Some(unfinished[0].id)
    );
    assert_eq!(
        copy.start(
            Flow::new("10.0.0.2", "S", "n2", None, false, t(9)),
            "x".into(),
            t(9)
        )
        .await?,
        None,
        "the unfinished flow still holds its machine"
    );
    let other = copy
        .start(
            Flow::new("10.0.0.7", "S", "n7", None, false, t(9)),
            "x".into(),
            t(9),
        )
        .await?;
    assert_eq!(other, Some(3));

    // Again into the same prefix: refused, nothing overwritten.
    let out = migrate(&cfg, &db, false)?;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already holds") && err.contains("etcdctl del --prefix"),
        "{err}"
    );
    assert_eq!(RepairQueueStore::load(&copy).await?.1.len(), 3);

    // A coordinator holding the SQLite file: refused, naming it.
    drop(source);
    let held = Store::open_exclusive(&db)?;
    let cfg2 = config(tmp.path(), &pki, &fresh_prefix("migrate-locked"))?;
    let out = migrate(&cfg2, &db, false)?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another coordinator"),
        "{}",
        text(&out)
    );
    drop(held);

    // backup and restore on etcd: refused, pointing to etcd's snapshot and the identity.
    for args in [
        &["backup", "--to", "/tmp/x.db"][..],
        &["restore", "--from", "/tmp/x.db"],
    ] {
        let out = command("coordinator")
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .output()?;
        assert_eq!(out.status.code(), Some(64), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("etcdctl snapshot save") && err.contains("coordinator renew-identity"),
            "{err}"
        );
    }

    // A missing file is not created.
    let out = migrate(&cfg2, &tmp.path().join("nope.db"), false)?;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(!tmp.path().join("nope.db").exists());
    Ok(())
}

/// The copy is killed after its first thousand entries: a coordinator refuses the prefix,
/// naming the command that finishes it; the rerun deletes the half copy and makes it whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_killed_halfway_is_refused_until_a_rerun_finishes_it() -> anyhow::Result<()> {
    const ENTRIES: usize = 2500;
    let _etcd = shared()?;
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let db = tmp.path().join("coordinator.db");
    let source = Store::open(&db)?;
    for chunk in 0..(ENTRIES / 500) {
        let writes = (0..500)
            .map(|i| {
                let a = format!("10.1.{}.{}", chunk, i % 250);
                Write::Insert(
                    Entry::new_queued(&a, "S", "qemu", "op", t(0)),
                    HistoryEvent::new("added", ""),
                )
            })
            .collect();
        source.commit(writes, t(1)).await?;
    }
    drop(source);
    let prefix = fresh_prefix("migrate-killed");
    let cfg = config(tmp.path(), &pki, &prefix)?;

    let mut child = command("coordinator")
        .arg("--config")
        .arg(&cfg)
        .args(["migrate", "--from-sqlite"])
        .arg(&db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = false;
    while Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) if l.contains("repair queue: 1000 of") => {
                seen = true;
                break;
            }
            Some(Ok(_)) => {}
            _ => break,
        }
    }
    child.kill()?;
    child.wait()?;
    assert!(seen, "no progress line for the repair queue");

    let e = etcd_store(&prefix).await.unwrap_err();
    assert!(
        matches!(e, EtcdError::MigrationUnfinished { .. }),
        "a coordinator must refuse half a copy: {e}"
    );
    assert!(
        e.to_string().contains("coordinator migrate --from-sqlite"),
        "{e}"
    );

    let out = migrate(&cfg, &db, true)?;
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(report["restarted"], true, "{report}");
    let copy = Store::from(etcd_store(&prefix).await?);
    let source = Store::open(&db)?;
    assert_eq!(
        dump(&copy).await?["repair queue"],
        dump(&source).await?["repair queue"]
    );
    assert_eq!(RepairQueueStore::load(&copy).await?.1.len(), ENTRIES);
    Ok(())
}

/// Every area (machines and
/// their transitions, diagnostics bundles, command groups, the remediation journal with its
/// switches, clearings, outcomes and own entries): the copy reads back the same through the
/// same traits.
#[tokio::test(flavor = "multi_thread")]
async fn every_area_moves_to_etcd_whole() -> anyhow::Result<()> {
    use coordinator::remediation::decision::{Decision, Outcome, Proposal, Rule};
    use coordinator::remediation::input::RepairOutcome;
    use coordinator::remediation::journal::JournalWrite;
    use coordinator::remediation::store::RemediationStore;
    use coordinator::repair::store::diagnostics::{DiagnosticsStore, NewBundle};
    use coordinator::repair::store::groups::{CommandGroupStore, GroupRecord};

    let _etcd = shared()?;
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(tmp.path(), "fleet.test")?;
    let db = tmp.path().join("coordinator.db");
    let source = Store::open(&db)?;
    fill(&source).await;
    source.as_sqlite().unwrap().with(|c| {
        for (i, a) in ["10.0.0.2", "10.0.0.3"].iter().enumerate() {
            c.execute(
                "INSERT INTO machines (address, hostname, serial, rack, role, machine_type, \
                 labels, source, state, state_since_ms, state_reason, created_ms, updated_ms, \
                 boot_id) VALUES (?1, ?2, 'S', 'r1', 'worker', 'qemu', '{}', 'inventory', \
                 'unhealthy', 1800000000000, 'kubelet', 1800000000000, 1800000000000, 'b1')",
                rusqlite::params![a, format!("n{i}")],
            )?;
            c.execute(
                "INSERT INTO machine_transitions (address, from_state, to_state, at_ms, reason) \
                 VALUES (?1, 'healthy', 'unhealthy', 1800000000000, 'kubelet')",
                [a],
            )?;
        }
        Ok(())
    })?;
    source
        .keep_bundle(NewBundle {
            entry: 2,
            address: "10.0.0.2".into(),
            request_id: "req-1".into(),
            collected_ms: 1_800_000_000_000,
            bytes: 5,
            truncated_parts: String::new(),
            content: "=== journal ===\nhello".into(),
        })
        .await?;
    source
        .record_group(
            GroupRecord {
                pgid: 4242,
                entry: 2,
                leader_start: 7,
                session: 4242,
                boot_id: "b".into(),
                command: "/usr/bin/true 10.0.0.2".into(),
            },
            t(8),
        )
        .await?;
    let decision = Decision {
        at: t(9),
        address: "10.0.0.2".into(),
        domain: "r1".into(),
        outcome: Outcome::Admitted,
        rule: Rule::AutoRepair,
        proposal: Some(Proposal {
            operation: "unhealthy".into(),
            machine_type: "qemu".into(),
            serial: "S".into(),
            source: "auto-repair".into(),
            reason: "kubelet".into(),
        }),
        sentence: "admitted (repair queue entry 2)".into(),
    };
    source
        .write_journal(vec![JournalWrite::Insert { seq: 1, decision }])
        .await?;
    source
        .set_switch(
            "pause".into(),
            Some("switch upgrade".into()),
            1_800_000_000_000,
        )
        .await?;
    source
        .add_outcomes(
            vec![(
                1,
                RepairOutcome {
                    address: "10.0.0.1".into(),
                    finished_at: t(2),
                    succeeded: true,
                },
            )],
            0,
        )
        .await?;
    source
        .update_own_entries(vec![(2, "10.0.0.2".into())], Vec::new(), 1_800_000_000_000)
        .await?;
    source
        .clear_machine("10.0.0.3".into(), 1_800_000_010_000)
        .await?;

    let prefix = fresh_prefix("migrate-all");
    let cfg = config(tmp.path(), &pki, &prefix)?;
    let out = migrate(&cfg, &db, false)?;
    assert!(out.status.success(), "{}", text(&out));
    let copy = Store::from(etcd_store(&prefix).await?);
    let want = dump(&source).await?;
    let got = dump(&copy).await?;
    for (area, lines) in &want {
        assert!(
            lines.as_ref().is_some_and(|l| !l.is_empty()),
            "the source's {area} are empty: the test would prove nothing"
        );
    }
    assert_eq!(difference(&want, &got, &BTreeSet::new()), None);
    assert_eq!(want, got);
    Ok(())
}
