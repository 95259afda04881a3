-- Machines and their state transitions (owned by the inventory/health area).
--
-- A machine is keyed by its address, as in CKE. Live health (heartbeats, last report)
-- stays in memory; only the derived state and every transition of it are durable.
-- Times are milliseconds since the Unix epoch.

CREATE TABLE machines (
    address        TEXT PRIMARY KEY NOT NULL,
    -- Must equal the name in the node's certificate; unique across the fleet.
    hostname       TEXT NOT NULL UNIQUE,
    serial         TEXT NOT NULL DEFAULT '',
    rack           TEXT NOT NULL DEFAULT '',
    role           TEXT NOT NULL DEFAULT '',
    -- NULL while the machine is awaiting registration: an unknown host is never
    -- trusted with a type (which selects its repair procedure).
    machine_type   TEXT,
    -- JSON object of string labels.
    labels         TEXT NOT NULL DEFAULT '{}',
    -- Where the record came from: inventory, admin, agent.
    source         TEXT NOT NULL,
    -- Derived health state: uninitialized, healthy, unhealthy, unreachable, stopped,
    -- awaiting-registration; admin states updating, retiring, retired.
    state          TEXT NOT NULL,
    state_since_ms INTEGER NOT NULL,
    state_reason   TEXT NOT NULL DEFAULT '',
    created_ms     INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL
);

-- Every state transition, with its reason. Never updated, only appended. `address` is
-- not a foreign key: history outlives a record that is re-keyed or removed.
CREATE TABLE machine_transitions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    address    TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    at_ms      INTEGER NOT NULL,
    reason     TEXT NOT NULL
);

CREATE INDEX machine_transitions_by_address ON machine_transitions (address, id);
