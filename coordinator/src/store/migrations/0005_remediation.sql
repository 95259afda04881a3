-- Automatic remediation (owned by the remediation area, coordinator/src/remediation/).
--
-- The decision journal: every decision of the remediation loop, admitted or held, with the
-- machine, the rule and the sentence with the numbers behind it. A decision repeated by
-- consecutive passes (a proposal held pass after pass) stays one line: `count` and
-- `last_ms` grow and `seq` moves on, so `events --follow` sees the repeat without a row per
-- pass. `seq` orders writes and repeats; `id` orders first appearances. Retention is
-- bounded by age and by row count (the loop prunes).
CREATE TABLE remediation_journal (
    id        INTEGER PRIMARY KEY,
    seq       INTEGER NOT NULL,
    first_ms  INTEGER NOT NULL,
    last_ms   INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    address   TEXT NOT NULL,
    domain    TEXT NOT NULL,
    outcome   TEXT NOT NULL,
    rule      TEXT NOT NULL,
    operation TEXT,
    sentence  TEXT NOT NULL,
    decision  TEXT NOT NULL
);
CREATE UNIQUE INDEX remediation_journal_seq ON remediation_journal (seq);
CREATE INDEX remediation_journal_address ON remediation_journal (address, seq);
CREATE INDEX remediation_journal_last ON remediation_journal (last_ms);
CREATE INDEX remediation_journal_outcome ON remediation_journal (outcome, first_ms);

-- Operator switches (pause with its reason, observe, auto-repair on/off and variables,
-- CKE constraints, confirmed outage): one row per switch that was ever set. Absent: the
-- config file's value holds.
CREATE TABLE remediation_switches (
    key     TEXT PRIMARY KEY NOT NULL,
    value   TEXT NOT NULL,
    set_ms  INTEGER NOT NULL
);

-- `coordinatorctl machines clear ADDRESS`: remediations before `at_ms` no longer count
-- towards the machine's escalation bound.
CREATE TABLE remediation_cleared (
    address TEXT PRIMARY KEY NOT NULL,
    at_ms   INTEGER NOT NULL
);

-- How repairs ended, kept after their entries are deleted from the queue: slow start widens
-- on successes and narrows on failures. `entry_idx` is the repair queue's index.
CREATE TABLE remediation_outcomes (
    entry_idx   INTEGER PRIMARY KEY NOT NULL,
    address     TEXT NOT NULL,
    finished_ms INTEGER NOT NULL,
    succeeded   INTEGER NOT NULL
);
CREATE INDEX remediation_outcomes_finished ON remediation_outcomes (finished_ms);
