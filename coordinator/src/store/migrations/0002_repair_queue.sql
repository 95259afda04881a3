-- Repair queue tables (owned by the repair area).
--
-- One row per entry with CKE's RepairQueueEntry fields, plus the coordinator's progress
-- inside the current step (phase*), so that a restart resumes an entry exactly where it
-- stood. AUTOINCREMENT: an index is never reused, even after its entry is deleted.
-- Times are milliseconds since the Unix epoch; 0 means "none".

CREATE TABLE repair_queue_entries (
    idx                     INTEGER PRIMARY KEY AUTOINCREMENT,
    address                 TEXT NOT NULL,
    nodename                TEXT NOT NULL DEFAULT '',
    serial                  TEXT NOT NULL DEFAULT '',
    machine_type            TEXT NOT NULL,
    operation               TEXT NOT NULL,
    -- queued | processing | succeeded | failed
    status                  TEXT NOT NULL,
    step                    INTEGER NOT NULL DEFAULT 0,
    -- waiting | draining | watching
    step_status             TEXT NOT NULL,
    deleted                 INTEGER NOT NULL DEFAULT 0,
    last_transition_ms      INTEGER NOT NULL,
    drain_backoff_count     INTEGER NOT NULL DEFAULT 0,
    drain_backoff_expire_ms INTEGER NOT NULL DEFAULT 0,
    -- idle | command | retry-wait | watching | success-command
    phase                   TEXT NOT NULL DEFAULT 'idle',
    phase_attempt           INTEGER NOT NULL DEFAULT 0,
    phase_time_ms           INTEGER NOT NULL DEFAULT 0,
    boot_id_before          TEXT NOT NULL DEFAULT '',
    created_ms              INTEGER NOT NULL
);

CREATE INDEX repair_queue_entries_active ON repair_queue_entries (status, address);

-- Every transition of an entry, with its reason and any command output (truncated).
CREATE TABLE repair_queue_history (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    entry_idx   INTEGER NOT NULL REFERENCES repair_queue_entries (idx) ON DELETE CASCADE,
    at_ms       INTEGER NOT NULL,
    status      TEXT NOT NULL,
    step        INTEGER NOT NULL,
    step_status TEXT NOT NULL,
    event       TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    output      TEXT NOT NULL DEFAULT ''
);

CREATE INDEX repair_queue_history_entry ON repair_queue_history (entry_idx, id);

-- Queue-wide settings: `enabled` is 1 or 0.
CREATE TABLE repair_queue_settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

INSERT INTO repair_queue_settings (key, value) VALUES ('enabled', '1');
