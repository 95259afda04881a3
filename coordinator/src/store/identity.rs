//! The store's identity: a random id made once with the database (migration 0003) and kept
//! in it for its whole life.
//!
//! It is what makes power request ids unique across databases: a re-created database or a
//! test install next to production numbers its repair entries from 1 again, but under another
//! identity. It is read once when the repair queue starts. This module does not make ids of
//! requests itself (see [`crate::repair::entry::power_request_id`]).

use rusqlite::Connection;

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
    use crate::store::Store;

    #[test]
    fn each_database_gets_its_own_identity_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(&dir.path().join("a.db")).unwrap();
        let b = Store::open(&dir.path().join("b.db")).unwrap();
        let ida = a.with(|c| read(c)).unwrap();
        let idb = b.with(|c| read(c)).unwrap();
        assert_eq!(ida.len(), 32, "{ida}");
        assert!(
            ida.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(ida, idb, "two databases share an identity");
        drop(a);
        let again = Store::open(&dir.path().join("a.db")).unwrap();
        assert_eq!(again.with(|c| read(c)).unwrap(), ida, "changed on reopen");
    }
}
