-- Repair queue entries the remediation loop enqueued itself, as opposed to entries added by
-- hand: only these are deleted by the loop once they have succeeded
-- ([remediation] delete_succeeded_after). A row goes when its entry has left the queue.
CREATE TABLE remediation_entries (
    entry_idx   INTEGER PRIMARY KEY NOT NULL,
    address     TEXT NOT NULL,
    admitted_ms INTEGER NOT NULL
);

-- Entries enqueued before this table existed: each admission's journal line ends with
-- "(repair queue entry N)" (an entry no longer in the queue is forgotten at the next pass).
INSERT OR IGNORE INTO remediation_entries (entry_idx, address, admitted_ms)
SELECT CAST(substr(sentence, instr(sentence, '(repair queue entry ') + 20) AS INTEGER),
       address, first_ms
FROM remediation_journal
WHERE outcome = 'admitted' AND instr(sentence, '(repair queue entry ') > 0;
