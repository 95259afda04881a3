-- kdump (owned by the kdump area, coordinator/src/kdump/ and coordinator/src/fence/).
--
-- `kdump_status`: per machine, the last notice its kdump initramfs sent
-- (`node-agent kdump-notify`): "dumping since" and "dump done at", by the coordinator's
-- clock, with the node's own time and the crashed kernel's boot id when it was given.
-- One row per machine, replaced by each notice; a start clears the previous done.
--
-- `fence_flows` gains the kdump leg of a flow (coordinator/src/fence/flow.rs): when the
-- dump the flow released on started, until when the flow waits for it to finish before
-- the power cycle, and whether that release completed. Times are Unix milliseconds, 0 for
-- none.

CREATE TABLE kdump_status (
    address          TEXT PRIMARY KEY,
    phase            TEXT NOT NULL,
    dump_started_ms  INTEGER NOT NULL DEFAULT 0,
    dump_done_ms     INTEGER NOT NULL DEFAULT 0,
    boot_id          TEXT,
    node_time_ms     INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL
);

ALTER TABLE fence_flows ADD COLUMN kdump_started_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fence_flows ADD COLUMN kdump_deadline_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fence_flows ADD COLUMN kdump_released INTEGER NOT NULL DEFAULT 0;
