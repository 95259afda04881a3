//! `coordinator renew-identity`, the step after restoring an etcd snapshot
//! (`docs/operations.md`, "Backup and restore on etcd"), against a real etcd and a real
//! coordinator: refused (exit 75) while a coordinator leads, naming it and its lease's time
//! left, with the identity untouched; after a clean stop (the leader key deleted) a new
//! identity is written and printed (and as JSON); refused (exit 64) on a SQLite store,
//! pointing at `coordinator restore`.

use std::time::Duration;

use anyhow::{Context, Result};
use coordinator::store::etcd::{EtcdSettings, EtcdStore};
use coordinator::store::{IdentityStore, Store};
use testkit::etcd::{fresh_prefix, shared};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, command};

fn identity(endpoint: &str, prefix: &str) -> Result<String> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let s = EtcdStore::connect(
            EtcdSettings::new(vec![endpoint.to_string()]).with_prefix(prefix.to_string()),
        )
        .await?;
        Ok(Store::from(s).identity().await?)
    })
}

fn renew(c: &Coordinator, json: bool) -> Result<std::process::Output> {
    let mut cmd = command("coordinator");
    cmd.arg("--config").arg(&c.config).arg("renew-identity");
    if json {
        cmd.arg("--json");
    }
    Ok(cmd.output()?)
}

#[test]
fn renew_identity_is_refused_under_a_leader_and_renews_once_it_is_gone() -> Result<()> {
    let etcd = shared()?;
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "fleet.test")?;
    let prefix = fresh_prefix("renew");
    let endpoint = etcd.endpoint(0);
    let mut c = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions {
            extra: format!(
                "[store]\nbackend = \"etcd\"\nendpoints = [{endpoint:?}]\nprefix = \"{prefix}/\"\n\
                 [ha]\nlease_ttl = \"3s\"\n"
            ),
            ..Default::default()
        },
    )?;
    c.wait_leading(Duration::from_secs(30))?;
    let before = identity(&endpoint, &prefix)?;

    let out = renew(&c, false)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains(&format!(
            "{prefix}/leader names a leader (coord at 127.0.0.1:"
        )),
        "{err}"
    );
    assert!(err.contains(" s left: a coordinator leads"), "{err}");
    assert_eq!(
        identity(&endpoint, &prefix)?,
        before,
        "renewed under a leader"
    );

    // A clean stop resigns: the leader key goes, and the renewal is taken.
    let code = c
        .proc
        .take()
        .context("coordinator process")?
        .sigterm(Duration::from_secs(10))?;
    assert_eq!(code, Some(0));
    let out = renew(&c, false)?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = identity(&endpoint, &prefix)?;
    assert_ne!(after, before);
    assert!(
        text.contains(&format!(
            "new store identity {after} under {prefix} (it was {before})"
        )),
        "{text}"
    );
    let out = renew(&c, true)?;
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["previous"], after.as_str(), "{v}");
    assert_eq!(v["store_id"], identity(&endpoint, &prefix)?.as_str(), "{v}");

    // The coordinator starts again, leads, and its store has the new identity.
    c.restart()?;
    c.wait_leading(Duration::from_secs(30))?;
    Ok(())
}

#[test]
fn renew_identity_on_sqlite_points_at_restore() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki = Pki::create(&tmp.path().join("pki"), "fleet.test")?;
    let c = Coordinator::start(
        &tmp.path().join("coord"),
        &pki,
        &CoordinatorOptions::default(),
    )?;
    let out = renew(&c, false)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("on SQLite, `coordinator restore --from BACKUP`"),
        "{err}"
    );
    Ok(())
}
