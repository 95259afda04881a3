//! The store's identity: a random id made once with the database (migration 0003) and kept
//! in it for its whole life.
//!
//! It is what makes power request ids unique across databases: a re-created database or a
//! test install next to production numbers its repair entries from 1 again, but under another
//! identity. It is read once when the repair queue starts. This module does not make ids of
//! requests itself (see [`crate::repair::entry::power_request_id`]).
//!
//! The store also keeps the coordinator's fencing epoch ([`IdentityStore::next_epoch`],
//! migration 0012 on SQLite): with the identity it makes the token every power request and
//! agent action carries ([`crate::lease_token`]).
//!
//! [`IdentityStore`] is the area's interface; [`read`] is its SQL on SQLite.

use std::future::Future;

use rusqlite::Connection;

use super::{Sqlite, Store, StoreError, dispatch};

/// The store's identity, as an area of state.
pub trait IdentityStore {
    /// The store's identity (32 lower-case hex digits), made with the store and never
    /// changed but by a restore. Fails when it is missing: without it, ids could collide
    /// with another store's, so nothing may be sent.
    fn identity(&self) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// Bumps the store's fencing epoch by one, durably, and returns the new value: called
    /// once per coordinator start. It never goes backwards for one identity.
    fn next_epoch(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl IdentityStore for Sqlite {
    async fn identity(&self) -> Result<String, StoreError> {
        self.call(|c| read(c)).await
    }

    async fn next_epoch(&self) -> Result<u64, StoreError> {
        self.call(|c| bump_epoch(c)).await
    }
}

impl IdentityStore for Store {
    async fn identity(&self) -> Result<String, StoreError> {
        dispatch!(self, b => b.identity().await)
    }

    async fn next_epoch(&self) -> Result<u64, StoreError> {
        dispatch!(self, b => b.next_epoch().await)
    }
}

/// Reads the store's identity (32 lower-case hex digits).
///
/// Fails when the row is missing (a database not migrated to version 3, or one edited by
/// hand): without it, ids could collide with another database's, so nothing may be sent.
pub fn read(conn: &Connection) -> rusqlite::Result<String> {
    conn.query_row(
        "SELECT store_id FROM store_identity WHERE id = 1",
        [],
        |r| r.get(0),
    )
}

/// Bumps the epoch by one and returns it. The connection runs with `synchronous = FULL`
/// ([`super::Sqlite`]), so the bump is on disk when this returns.
pub fn bump_epoch(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row(
        "UPDATE store_identity SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(|e| e.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_database_gets_its_own_identity_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(&dir.path().join("a.db")).unwrap();
        let b = Store::open(&dir.path().join("b.db")).unwrap();
        let ida = a.identity().await.unwrap();
        let idb = b.identity().await.unwrap();
        assert_eq!(ida.len(), 32, "{ida}");
        assert!(
            ida.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(ida, idb, "two databases share an identity");
        drop(a);
        let again = Store::open(&dir.path().join("a.db")).unwrap();
        assert_eq!(again.identity().await.unwrap(), ida, "changed on reopen");
    }

    #[tokio::test]
    async fn the_epoch_grows_by_one_per_start_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let a = Store::open(&path).unwrap();
        assert_eq!(a.next_epoch().await.unwrap(), 1);
        assert_eq!(a.next_epoch().await.unwrap(), 2);
        drop(a);
        let again = Store::open(&path).unwrap();
        assert_eq!(again.next_epoch().await.unwrap(), 3);
    }
}
