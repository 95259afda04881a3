-- Fence flows (owned by the fencing area, coordinator/src/fence/store.rs).
--
-- One row per flow, rewritten at each state change in the same transaction as a line of its
-- history. The row is committed before the state's action runs, so a coordinator that
-- restarts reads what to do next from it (coordinator/src/fence/flow.rs). `how_json` is the
-- release plan with the Node's saved labels and annotations (when the Node is deleted), kept
-- until the Node is restored. Times are Unix milliseconds, 0 for none.

CREATE TABLE fence_flows (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    address           TEXT NOT NULL,
    serial            TEXT NOT NULL,
    node              TEXT NOT NULL,
    keep_off          INTEGER NOT NULL,
    boot_id_before    TEXT,
    state             TEXT NOT NULL,
    state_detail      TEXT NOT NULL DEFAULT '',
    state_since_ms    INTEGER NOT NULL,
    deadline_ms       INTEGER NOT NULL DEFAULT 0,
    power_attempt     INTEGER NOT NULL DEFAULT 0,
    how_json          TEXT,
    confirmed_off_ms  INTEGER NOT NULL DEFAULT 0,
    confirm_request   TEXT,
    powered_on_ms     INTEGER NOT NULL DEFAULT 0,
    failure           TEXT,
    created_ms        INTEGER NOT NULL
);

-- At most one unfinished flow per machine.
CREATE UNIQUE INDEX fence_flows_active ON fence_flows (address)
    WHERE state NOT IN ('done', 'failed');

CREATE TABLE fence_flow_history (
    flow_id  INTEGER NOT NULL REFERENCES fence_flows (id) ON DELETE CASCADE,
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms    INTEGER NOT NULL,
    state    TEXT NOT NULL,
    event    TEXT NOT NULL
);
CREATE INDEX fence_flow_history_flow ON fence_flow_history (flow_id, seq);
