//! The repair queue: CKE repair semantics, durable in SQLite.
