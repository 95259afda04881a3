-- Which fence flow a repair step started (owned by the repair queue's fencing,
-- coordinator/src/repair/fencing.rs).
--
-- A step that fences (`@fence`, or a drain that must fence because the node is dead) looks
-- its key up here before starting a flow, so a step re-run after a coordinator restart waits
-- for the flow it started instead of starting a second one. The key is the step's power
-- request id (`<store>-repair-<index>-step<s>-attempt<a>`) or, for a drain,
-- `<store>-repair-<index>-step<s>-drain<n>-fence`. Times are Unix milliseconds.

CREATE TABLE repair_fence_flows (
    step_key     TEXT PRIMARY KEY,
    entry_index  INTEGER NOT NULL,
    flow_id      INTEGER NOT NULL REFERENCES fence_flows (id),
    created_ms   INTEGER NOT NULL
);
CREATE INDEX repair_fence_flows_entry ON repair_fence_flows (entry_index);
