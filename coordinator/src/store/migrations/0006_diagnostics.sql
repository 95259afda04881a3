-- Diagnostics bundles that node-agents sent for repair entries (owned by the repair area,
-- coordinator/src/repair/diagnostics.rs; `coordinatorctl diagnostics`).
--
-- One row per collect-diagnostics request: a resent request (same id, after a coordinator
-- restart) replaces its row instead of adding one. `entry_idx` is not a foreign key: the
-- evidence is kept after the entry is deleted, up to a number of bundles per machine.

CREATE TABLE repair_diagnostics (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    entry_idx       INTEGER NOT NULL,
    address         TEXT NOT NULL,
    request_id      TEXT NOT NULL UNIQUE,
    collected_ms    INTEGER NOT NULL,
    bytes           INTEGER NOT NULL,
    truncated_parts TEXT NOT NULL,
    content         TEXT NOT NULL
);

CREATE INDEX repair_diagnostics_by_address ON repair_diagnostics (address, id);
CREATE INDEX repair_diagnostics_by_entry ON repair_diagnostics (entry_idx, id);
