-- The store's identity (owned by the store itself).
--
-- A random id made once, when this database is created, and never changed. Power request ids
-- start with it, so two databases (a re-created one, a test install next to production) never
-- send the same request id to a gateway, which executes each id at most once and would answer
-- the second database's request with the first one's result. 16 random bytes from SQLite's
-- PRNG, seeded from the operating system's randomness.
--
-- One row, enforced by the CHECK.

CREATE TABLE store_identity (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    store_id    TEXT NOT NULL,
    created_ms  INTEGER NOT NULL
);

INSERT INTO store_identity (id, store_id, created_ms)
VALUES (1, lower(hex(randomblob(16))), CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
