//! The decision journal's writes as the remediation loop makes them; the journal, the
//! operator switches, cleared machines and repair outcomes are kept through
//! [`super::store::RemediationStore`].
//!
//! A decision the previous pass also made (same machine, outcome, rule and operation) is a
//! repeat: its line's `count`, `last_ms`, `sentence` and `seq` are updated instead of a row
//! being added, so a proposal held for a day is one line, not 8,640. Admissions are never
//! repeats: each one enqueued a repair.

use super::decision::Decision;

/// How many lines `events` returns when the query sets no limit: a screenful of an
/// incident; `--since` and `--machine` narrow further.
pub const DEFAULT_EVENTS_LIMIT: u32 = 1000;

/// One journal write of a pass.
#[derive(Debug, Clone)]
pub enum JournalWrite {
    /// A new line.
    Insert {
        /// Its sequence number.
        seq: u64,
        /// The decision.
        decision: Decision,
    },
    /// The line `id` was made again.
    Repeat {
        /// The line.
        id: i64,
        /// Its new sequence number.
        seq: u64,
        /// The decision as made now (its time and sentence replace the line's latest).
        decision: Decision,
    },
}

/// The operation a decision proposed, if any.
pub fn operation(d: &Decision) -> Option<&str> {
    d.proposal.as_ref().map(|p| p.operation.as_str())
}

/// One line of the last pass: (id, address, outcome, rule, operation).
pub type LastLine = (i64, String, String, String, Option<String>);
