-- Process groups of running repair, health-check and success commands (owned by the repair
-- area, coordinator/src/repair/orphans.rs).
--
-- A row is written right after a command is spawned and deleted when it ends. Rows left by
-- a coordinator that was killed name groups that may still run: the next coordinator kills
-- them before it runs the interrupted step again. The leader's start time (clock ticks
-- since boot, /proc/<pid>/stat field 22), the boot id and the session id make sure a
-- recycled pid is never signalled. `entry_idx` is not a foreign key: the row must outlive
-- the entry's deletion until the group is dead.

CREATE TABLE repair_command_groups (
    pgid          INTEGER PRIMARY KEY NOT NULL,
    entry_idx     INTEGER NOT NULL,
    leader_start  INTEGER NOT NULL,
    session_id    INTEGER NOT NULL,
    boot_id       TEXT NOT NULL,
    command       TEXT NOT NULL,
    started_ms    INTEGER NOT NULL
);
