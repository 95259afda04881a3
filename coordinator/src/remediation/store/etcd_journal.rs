//! The decision journal on etcd: one key per line, keyed by the line's latest sequence
//! number, so the newest lines are the last keys and no query reads the whole journal.
//!
//! `remediation/lines/<seq>` (`docs/design.md`, "The etcd store") holds a line: sequence
//! number, first and last time, count, machine, domain, outcome, rule, operation, sentence,
//! and the decision itself as JSON. A line made again by the next pass (a repeat) moves to
//! its new sequence number in one transaction (the old key deleted, the new one created,
//! comparing the old key's `mod_revision` and the new key's absence), so key order is the
//! order of sequence numbers, as `events` returns them. The id a write returns, and a
//! repeat names, is the line's key number.
//!
//! `remediation/journal-head` holds the largest sequence number written, moved in every
//! write's transaction. Reads walk the keys and stop as soon as they have what they need:
//! `events` from the newest down (its `after_seq` is the walk's lower bound, its `limit`
//! ends it), the resume from the newest down to the history window, the pruning from the
//! oldest up to the retention bound, and the count bound by etcd's count and one range
//! delete. A walk down reads windows of sequence numbers below the head, each upwards and
//! twice as wide as the last (etcd reads a whole range to sort it downwards), all at the
//! revision of the first. A walk that uses times goes an hour past its bound ([`CLOCK_SLACK_MS`]):
//! lines are written in pass order, each with its pass's time, so a line later in key
//! order is older than one before it only by the clock difference of two coordinators.

use std::collections::{BTreeMap, BTreeSet};

use protocol::admin::remediation::{EventsQuery, JournalLine};
use serde::{Deserialize, Serialize};

use super::Resume;
use crate::clock::to_unix_ms;
use crate::remediation::decision::{Decision, Outcome};
use crate::remediation::journal::{DEFAULT_EVENTS_LIMIT, JournalWrite, LastLine, operation};
use crate::store::etcd::kv::num_key;
use crate::store::etcd::{EtcdError, EtcdStore, Versioned};

/// The journal's directory (relative to the store's prefix).
pub(super) const LINES: &str = "remediation/lines";

/// The largest sequence number written (relative to the store's prefix).
pub(super) const HEAD: &str = "remediation/journal-head";

/// The first window of a walk down, in sequence numbers; each next one is twice as wide,
/// up to [`WIDEST`].
const FIRST_WINDOW: u64 = 256;
const WIDEST: u64 = 1 << 16;

/// Journal writes per transaction: a repeat is two operations and two compares, under
/// etcd's default `--max-txn-ops` (128) with room for a leader's fence.
const TXN_WRITES: usize = 60;

/// How many lines one page of a walk reads (a line is about 1 KiB with its decision).
const PAGE: i64 = 200;

/// How far past a time bound a walk goes on: more than any clock difference between two
/// coordinators of one fleet.
const CLOCK_SLACK_MS: i64 = 3_600_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct LineValue {
    /// The sequence number the line was first written at (informational; the key is its
    /// latest).
    id: i64,
    seq: u64,
    first_ms: i64,
    last_ms: i64,
    count: u64,
    pub(super) address: String,
    domain: String,
    pub(super) outcome: String,
    pub(super) rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    operation: Option<String>,
    sentence: String,
    decision: serde_json::Value,
}

impl LineValue {
    fn line(&self) -> JournalLine {
        JournalLine {
            seq: self.seq,
            first_unix_ms: u64::try_from(self.first_ms).unwrap_or(0),
            last_unix_ms: u64::try_from(self.last_ms).unwrap_or(0),
            count: self.count,
            address: self.address.clone(),
            domain: self.domain.clone(),
            outcome: self.outcome.clone(),
            rule: self.rule.clone(),
            operation: self.operation.clone(),
            sentence: self.sentence.clone(),
        }
    }

    fn new(seq: u64, d: &Decision) -> Self {
        let at = to_unix_ms(d.at);
        Self {
            id: i64::try_from(seq).unwrap_or(i64::MAX),
            seq,
            first_ms: at,
            last_ms: at,
            count: 1,
            address: d.address.clone(),
            domain: d.domain.clone(),
            outcome: d.outcome.as_str().to_string(),
            rule: d.rule.as_str().to_string(),
            operation: operation(d).map(str::to_string),
            sentence: d.sentence.clone(),
            decision: decision_json(d),
        }
    }

    fn repeat(&mut self, seq: u64, d: &Decision) {
        self.seq = seq;
        self.last_ms = to_unix_ms(d.at);
        self.count += 1;
        self.sentence = d.sentence.clone();
        self.decision = decision_json(d);
    }
}

fn line_key(key: i64) -> String {
    format!("{LINES}/{}", num_key(u64::try_from(key).unwrap_or(0)))
}

fn key_of(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn decision_json(d: &Decision) -> serde_json::Value {
    serde_json::to_value(d).unwrap_or(serde_json::Value::Null)
}

/// A walk down the journal from its head: [`EtcdStore::journal_down`].
struct Down {
    /// The next window ends below this sequence number.
    below: u64,
    /// The walk ends at this sequence number (included).
    floor: u64,
    width: u64,
    revision: i64,
}

impl Down {
    /// The next lines down, newest first; empty when the walk is over.
    async fn next(&mut self, store: &EtcdStore) -> Result<Vec<(i64, LineValue)>, EtcdError> {
        while self.below > self.floor {
            let from = self.below.saturating_sub(self.width).max(self.floor);
            let mut scan = store
                .scan_between(LINES, &num_key(from), &num_key(self.below))
                .at_revision(self.revision);
            let mut lines = Vec::new();
            loop {
                let page = scan.next::<LineValue>(PAGE).await?;
                if page.is_empty() {
                    break;
                }
                lines.extend(
                    page.into_iter()
                        .map(|(k, v)| (k.parse::<i64>().unwrap_or(0), v.value)),
                );
            }
            self.revision = scan.revision();
            self.below = from;
            self.width = (self.width * 2).min(WIDEST);
            if !lines.is_empty() {
                lines.reverse();
                return Ok(lines);
            }
        }
        Ok(Vec::new())
    }
}

impl EtcdStore {
    /// The largest sequence number written; a journal without its head key (none written
    /// yet) is read once upwards for its last key.
    async fn journal_head(&self) -> Result<u64, EtcdError> {
        if let Some(v) = self.kv_get::<u64>(HEAD).await? {
            return Ok(v.value);
        }
        let mut scan = self.scan(LINES, None);
        let mut last = 0;
        loop {
            let keys = scan.next_keys(1000).await?;
            match keys.last() {
                Some(k) => last = k.parse().unwrap_or(last),
                None => return Ok(last),
            }
        }
    }

    /// A walk down the journal from its newest line to the line at `floor`.
    async fn journal_down(&self, floor: u64) -> Result<Down, EtcdError> {
        Ok(Down {
            below: self.journal_head().await?.saturating_add(1),
            floor,
            width: FIRST_WINDOW,
            revision: 0,
        })
    }

    /// A pass's journal writes, in transactions of whole lines; the key of each line.
    pub(super) async fn journal_write(
        &self,
        writes: Vec<JournalWrite>,
    ) -> Result<Vec<i64>, EtcdError> {
        let mut ids = Vec::with_capacity(writes.len());
        for part in writes.chunks(TXN_WRITES) {
            ids.extend(self.journal_write_part(part).await?);
        }
        Ok(ids)
    }

    async fn journal_write_part(&self, writes: &[JournalWrite]) -> Result<Vec<i64>, EtcdError> {
        // The lines repeated, as read now, by the key the caller names.
        let mut read: BTreeMap<i64, Versioned<LineValue>> = BTreeMap::new();
        for w in writes {
            if let JournalWrite::Repeat { id, .. } = w
                && !read.contains_key(id)
                && let Some(v) = self.kv_get::<LineValue>(&line_key(*id)).await?
            {
                read.insert(*id, v);
            }
        }
        // What the part leaves: lines at their new keys, and the keys they left.
        let mut written: BTreeMap<i64, LineValue> = BTreeMap::new();
        let mut left: BTreeSet<i64> = BTreeSet::new();
        let mut ids = Vec::with_capacity(writes.len());
        for w in writes {
            match w {
                JournalWrite::Insert { seq, decision } => {
                    written.insert(key_of(*seq), LineValue::new(*seq, decision));
                    ids.push(key_of(*seq));
                }
                JournalWrite::Repeat { id, seq, decision } => {
                    let base = written
                        .remove(id)
                        .or_else(|| read.get(id).map(|v| v.value.clone()));
                    // A line pruned meanwhile is not made again (as SQLite's UPDATE).
                    let Some(mut line) = base else {
                        ids.push(*id);
                        continue;
                    };
                    line.repeat(*seq, decision);
                    if *id != key_of(*seq) {
                        left.insert(*id);
                    }
                    written.insert(key_of(*seq), line);
                    ids.push(key_of(*seq));
                }
            }
        }
        let mut txn = self.txn();
        for (key, v) in &read {
            txn = txn.if_mod_revision(&line_key(*key), v.mod_revision);
        }
        for key in written.keys().filter(|k| !read.contains_key(k)) {
            txn = txn.if_absent(&line_key(*key));
        }
        for key in left.iter().filter(|k| !written.contains_key(k)) {
            txn = txn.delete(&line_key(*key));
        }
        for (key, line) in &written {
            txn = txn.put(&line_key(*key), line)?;
        }
        if let Some(head) = written.keys().next_back() {
            txn = txn.put(HEAD, head)?;
        }
        if txn.commit().await? {
            return Ok(ids);
        }
        // Someone else wrote a repeated line or took a sequence number: not a race to rerun
        // (only the leader writes the journal), a conflict to report.
        let key = read
            .keys()
            .chain(written.keys())
            .next()
            .map(|k| self.key(&line_key(*k)))
            .unwrap_or_default();
        Err(EtcdError::Conflict { key })
    }

    /// The newest line of `address`, if any.
    pub(super) async fn journal_newest_of(
        &self,
        address: &str,
    ) -> Result<Option<LineValue>, EtcdError> {
        let mut down = self.journal_down(0).await?;
        loop {
            let lines = down.next(self).await?;
            if lines.is_empty() {
                return Ok(None);
            }
            if let Some((_, l)) = lines.into_iter().find(|(_, l)| l.address == address) {
                return Ok(Some(l));
            }
        }
    }

    /// Lines matching `q`, ordered by sequence number: the newest `limit` of them.
    pub(super) async fn journal_events(
        &self,
        q: &EventsQuery,
    ) -> Result<Vec<JournalLine>, EtcdError> {
        let limit = if q.limit == 0 {
            DEFAULT_EVENTS_LIMIT
        } else {
            q.limit
        };
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let since = q
            .since_unix_ms
            .map(|s| i64::try_from(s).unwrap_or(i64::MAX));
        let mut down = self
            .journal_down(q.after_seq.map_or(0, |s| s.saturating_add(1)))
            .await?;
        let mut out: Vec<JournalLine> = Vec::new();
        'walk: loop {
            let lines = down.next(self).await?;
            if lines.is_empty() {
                break;
            }
            for (_, l) in lines {
                if since.is_some_and(|s| l.last_ms < s.saturating_sub(CLOCK_SLACK_MS)) {
                    break 'walk;
                }
                if q.machine.as_ref().is_some_and(|m| &l.address != m)
                    || since.is_some_and(|s| l.last_ms < s)
                {
                    continue;
                }
                out.push(l.line());
                if out.len() >= limit {
                    break 'walk;
                }
            }
        }
        out.reverse();
        Ok(out)
    }

    /// What a restarting loop reads of the journal: the largest sequence number, the
    /// admissions first made at or after `admitted_since_ms` (oldest first), and the lines
    /// last seen at the journal's latest time if that is at or after `last_pass_since_ms`.
    pub(super) async fn journal_resume(
        &self,
        admitted_since_ms: i64,
        last_pass_since_ms: i64,
        resume: &mut Resume,
    ) -> Result<(), EtcdError> {
        let mut down = self.journal_down(0).await?;
        let mut latest: Option<i64> = None;
        let mut last_pass: Vec<(i64, LineValue)> = Vec::new();
        let mut admissions: Vec<(i64, Decision)> = Vec::new();
        'walk: loop {
            let lines = down.next(self).await?;
            if lines.is_empty() {
                break;
            }
            for (key, l) in lines {
                if latest.is_none() {
                    resume.max_seq = l.seq;
                }
                let top = *latest.get_or_insert(l.last_ms);
                let floor = admitted_since_ms.min(top);
                if l.last_ms < floor.saturating_sub(CLOCK_SLACK_MS) {
                    break 'walk;
                }
                if l.last_ms > top {
                    // A later time further down (another coordinator's clock): the last
                    // pass is the lines at the latest time found.
                    latest = Some(l.last_ms);
                    last_pass.clear();
                }
                if Some(l.last_ms) == latest {
                    last_pass.push((key, l.clone()));
                }
                if l.outcome == Outcome::Admitted.as_str()
                    && l.first_ms >= admitted_since_ms
                    && let Ok(d) = serde_json::from_value::<Decision>(l.decision)
                {
                    admissions.push((key, d));
                }
            }
        }
        admissions.sort_by_key(|(key, _)| *key);
        resume.admissions = admissions.into_iter().map(|(_, d)| d).collect();
        if latest.is_some_and(|t| t >= last_pass_since_ms) {
            resume.last_pass = last_pass
                .into_iter()
                .map(|(key, l)| -> LastLine { (key, l.address, l.outcome, l.rule, l.operation) })
                .collect();
        }
        Ok(())
    }

    /// Deletes lines last seen before `before_ms`, then all but the newest `max_rows`; how
    /// many went.
    pub(super) async fn journal_prune(
        &self,
        before_ms: i64,
        max_rows: u64,
    ) -> Result<usize, EtcdError> {
        let mut gone: Vec<String> = Vec::new();
        let mut scan = self.scan(LINES, None);
        'walk: loop {
            let page = scan.next::<LineValue>(PAGE).await?;
            if page.is_empty() {
                break;
            }
            for (key, v) in page {
                if v.value.last_ms >= before_ms.saturating_add(CLOCK_SLACK_MS) {
                    break 'walk;
                }
                if v.value.last_ms < before_ms {
                    gone.push(format!("{LINES}/{key}"));
                }
            }
        }
        let by_age = gone.len();
        for part in gone.chunks(TXN_WRITES * 2) {
            let mut txn = self.txn();
            for k in part {
                txn = txn.delete(k);
            }
            txn.commit().await?;
        }
        // Then the count: the oldest keys past `max_rows`, a range delete per page.
        let count = u64::try_from(self.kv_count(LINES).await?).unwrap_or(0);
        let mut excess = count.saturating_sub(max_rows);
        let mut by_count = 0;
        let mut scan = self.scan(LINES, None);
        while excess > 0 {
            let keys = scan
                .next_keys(i64::try_from(excess.min(500)).unwrap_or(500))
                .await?;
            let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
                break;
            };
            let mut end = format!("{LINES}/{last}");
            end.push('\0');
            self.txn()
                .delete_range(&format!("{LINES}/{first}"), &end)
                .commit()
                .await?;
            excess = excess.saturating_sub(keys.len() as u64);
            by_count += keys.len();
        }
        Ok(by_age + by_count)
    }
}
