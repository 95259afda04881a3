//! The store's identity: a random id made once with the database (migration 0003) and kept
//! in it for its whole life.
//!
//! It is what makes power request ids unique across databases: a re-created database or a
//! test install next to production numbers its repair entries from 1 again, but under another
//! identity. It is read once when the repair queue starts. This module does not make ids of
//! requests itself (see [`crate::repair::entry::power_request_id`]).
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
}

impl IdentityStore for Sqlite {
    async fn identity(&self) -> Result<String, StoreError> {
        self.call(|c| read(c)).await
    }
}

impl IdentityStore for Store {
    async fn identity(&self) -> Result<String, StoreError> {
        dispatch!(self, b => b.identity().await)
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
}
