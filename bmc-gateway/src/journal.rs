//! The durable half of the at-most-once record: an append-only file in the gateway's state
//! directory, so that a request id executed before a restart (a crash, SIGKILL, an upgrade) is
//! still answered from the record afterwards and never executed again.
//!
//! The record also keeps the highest fencing epoch seen per store identity
//! ([`Record::Epoch`], see [`protocol::fencing`]): written and fsync'd whenever a request
//! raises it, before that request runs, and kept through every compaction, so that a
//! gateway restarted between a coordinator's successor and a deposed coordinator still
//! refuses the deposed one. One line per store identity ever seen (a restored store has a
//! new one), so it stays small.
//!
//! Two records per executed id: [`Record::Started`] is written and fsync'd before the action
//! runs, [`Record::Finished`] with the outcome is written and fsync'd before the answer is sent.
//! At start the file is read back: a finished id answers its outcome; an id that was started
//! but never finished (the gateway died while it ran) answers [`interrupted`], an honest
//! "outcome unknown" failure, and is not executed again.
//!
//! Each line is `<16 hex digits of FNV-1a 64> <JSON>`. A line whose checksum or JSON does not
//! hold (a torn tail after a kill mid-write, a zeroed block after a power loss) is skipped and
//! counted, never fatal. The file is rewritten (compacted) to the newest [`crate::dedup::REMEMBERED_IDS`]
//! finished ids at start and whenever it has grown to twice that, by writing a new file, fsyncing
//! it and renaming it over the old one. The record is opened under the state directory's
//! exclusive lock ([`crate::state_lock`]), held while it is open: one gateway per directory.
//! This module keeps no request state in memory beyond what loading needs (see
//! [`crate::dedup`]) and runs nothing.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use protocol::fencing::Epochs;
use protocol::gateway::PowerOutcome;
use serde::{Deserialize, Serialize};

pub(crate) mod error;

pub use error::JournalError;
use error::io;

/// The record's file name inside the state directory.
pub const FILE_NAME: &str = "requests.log";

/// One line of the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "record")]
pub enum Record {
    /// The request is about to be executed.
    Started {
        /// Request id.
        id: String,
        /// Machine and action ([`crate::dedup::fingerprint`]).
        fingerprint: String,
    },
    /// The request was executed (or refused) with this outcome.
    Finished {
        /// Request id.
        id: String,
        /// Machine and action.
        fingerprint: String,
        /// What was answered.
        outcome: PowerOutcome,
    },
    /// A request raised the highest epoch of a store identity to this one (written before
    /// that request runs).
    Epoch {
        /// The coordinator's store identity.
        store: String,
        /// The highest epoch seen for it.
        epoch: u64,
    },
}

/// A finished id read back from the record, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Remembered {
    /// Request id.
    pub id: String,
    /// Machine and action.
    pub fingerprint: String,
    /// The answer for a repeat.
    pub outcome: PowerOutcome,
}

/// What [`Journal::open`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Finished ids, oldest first, at most the capacity (interrupted ones included).
    pub finished: Vec<Remembered>,
    /// Ids started but never finished before the restart; now finished as [`interrupted`].
    pub interrupted: Vec<String>,
    /// Lines skipped as torn or corrupt.
    pub skipped: usize,
    /// The highest fencing epoch seen per store identity.
    pub epochs: Epochs,
}

/// The open record file.
#[derive(Debug)]
pub struct Journal {
    /// Held for as long as the record is open.
    _lock: crate::state_lock::StateLock,
    dir: PathBuf,
    path: PathBuf,
    file: File,
    /// Lines in the file (for when to compact).
    lines: usize,
    capacity: usize,
}

/// The answer for an id that was started but whose end the gateway never recorded.
pub fn interrupted(id: &str, fingerprint: &str) -> PowerOutcome {
    PowerOutcome::Failed {
        detail: format!(
            "{}the gateway restarted while request {id} ({fingerprint}) ran; \
             it is not executed again. Read the machine's power state before deciding, and use \
             a new request id to act again",
            protocol::gateway::OUTCOME_UNKNOWN
        ),
        retriable: false,
    }
}

/// FNV-1a, 64 bit: enough to tell a torn or garbled line from a whole one (not a defence
/// against anyone writing the file on purpose; the state directory is the gateway's own).
fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn encode(rec: &Record) -> String {
    let json = serde_json::to_string(rec).expect("records always serialise");
    format!("{:016x} {json}\n", checksum(json.as_bytes()))
}

fn decode(line: &str) -> Option<Record> {
    let (sum, json) = line.split_once(' ')?;
    if sum.len() != 16 || u64::from_str_radix(sum, 16).ok()? != checksum(json.as_bytes()) {
        return None;
    }
    serde_json::from_str(json).ok()
}

impl Journal {
    /// Opens the record in `dir` (creating both if needed), reads it back, finishes ids that
    /// were interrupted as [`interrupted`], and compacts it to the newest `capacity` finished
    /// ids.
    pub fn open(dir: &Path, capacity: usize) -> Result<(Self, Loaded), JournalError> {
        if dir.exists() && !dir.is_dir() {
            return Err(io(dir)(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it exists and is not a directory: state_dir must name a directory",
            )));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock = crate::state_lock::StateLock::acquire(dir)?;
        let path = dir.join(FILE_NAME);
        let capacity = capacity.max(1);
        let (read, epochs, skipped) = match File::open(&path) {
            Ok(f) => read_back(f, capacity).map_err(io(&path))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), Epochs::new(), 0),
            Err(e) => return Err(io(&path)(e)),
        };
        let mut loaded = Loaded {
            skipped,
            epochs,
            ..Loaded::default()
        };
        // An id started but never finished becomes finished: "outcome unknown". It is kept
        // even beyond the capacity: forgetting it would let a resend execute it again.
        for (id, fingerprint, outcome) in read {
            let outcome = outcome.unwrap_or_else(|| {
                loaded.interrupted.push(id.clone());
                interrupted(&id, &fingerprint)
            });
            loaded.finished.push(Remembered {
                id,
                fingerprint,
                outcome,
            });
        }
        let records: Vec<Record> = epoch_records(&loaded.epochs)
            .chain(loaded.finished.iter().map(finished_record))
            .collect();
        let lines = records.len();
        let file = rewrite(dir, &path, records.into_iter())?;
        let journal = Self {
            _lock: lock,
            dir: dir.to_path_buf(),
            path,
            file,
            lines,
            capacity,
        };
        Ok((journal, loaded))
    }

    /// Appends `rec` and waits until it is on disk; compacts first when the file has grown
    /// to twice the capacity.
    pub fn append(&mut self, rec: &Record) -> Result<(), JournalError> {
        if self.lines >= 2 * self.capacity + 16 {
            self.compact()?;
        }
        self.file
            .write_all(encode(rec).as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(io(&self.path))?;
        self.lines += 1;
        Ok(())
    }

    /// Rewrites the file with the highest epoch of each store, the newest `capacity`
    /// finished ids and every id still running.
    pub fn compact(&mut self) -> Result<(), JournalError> {
        let f = File::open(&self.path).map_err(io(&self.path))?;
        let (read, epochs, _) = read_back(f, self.capacity).map_err(io(&self.path))?;
        let records: Vec<Record> = epoch_records(&epochs)
            .chain(
                read.into_iter()
                    .map(|(id, fingerprint, outcome)| match outcome {
                        Some(outcome) => Record::Finished {
                            id,
                            fingerprint,
                            outcome,
                        },
                        None => Record::Started { id, fingerprint },
                    }),
            )
            .collect();
        self.lines = records.len();
        self.file = rewrite(&self.dir, &self.path, records.into_iter())?;
        Ok(())
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn epoch_records(epochs: &Epochs) -> impl Iterator<Item = Record> + '_ {
    epochs.iter().map(|(store, epoch)| Record::Epoch {
        store: store.to_string(),
        epoch,
    })
}

fn finished_record(r: &Remembered) -> Record {
    Record::Finished {
        id: r.id.clone(),
        fingerprint: r.fingerprint.clone(),
        outcome: r.outcome.clone(),
    }
}

/// An id read back: (id, fingerprint, outcome or `None` when started and not finished).
type ReadBack = (String, String, Option<PowerOutcome>);

/// Reads every whole line; returns the newest `capacity` finished ids and every running one,
/// in the order they were first seen, the highest epoch of each store, and how many lines
/// were skipped.
fn read_back(f: File, capacity: usize) -> std::io::Result<(Vec<ReadBack>, Epochs, usize)> {
    let mut out = Vec::new();
    let mut epochs = Epochs::new();
    let mut skipped = 0;
    // id → (fingerprint, outcome or None while running); order of first appearance.
    let mut state: HashMap<String, (String, Option<PowerOutcome>)> = HashMap::new();
    let mut order: VecDeque<String> = VecDeque::new();
    let mut reader = BufReader::new(f);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        // A last line without its newline was cut short by a kill: not a whole record.
        let whole = buf.last() == Some(&b'\n');
        let rec = whole
            .then(|| std::str::from_utf8(&buf[..buf.len() - 1]).ok())
            .flatten()
            .and_then(decode);
        match rec {
            None => skipped += 1,
            Some(Record::Epoch { store, epoch }) => epochs.raise(&store, epoch),
            Some(Record::Started { id, fingerprint }) => {
                if let std::collections::hash_map::Entry::Vacant(v) = state.entry(id.clone()) {
                    order.push_back(id);
                    v.insert((fingerprint, None));
                }
            }
            Some(Record::Finished {
                id,
                fingerprint,
                outcome,
            }) => {
                if !state.contains_key(&id) {
                    order.push_back(id.clone());
                }
                state.insert(id, (fingerprint, Some(outcome)));
            }
        }
    }
    let finished_total = state.values().filter(|(_, o)| o.is_some()).count();
    let mut drop_finished = finished_total.saturating_sub(capacity);
    for id in order {
        let Some((fingerprint, outcome)) = state.remove(&id) else {
            continue;
        };
        if outcome.is_some() && drop_finished > 0 {
            drop_finished -= 1;
            continue;
        }
        out.push((id, fingerprint, outcome));
    }
    Ok((out, epochs, skipped))
}

/// Writes `records` to a new file, fsyncs it, renames it over `path`, fsyncs the directory,
/// and returns `path` open for appending.
fn rewrite(
    dir: &Path,
    path: &Path,
    records: impl Iterator<Item = Record>,
) -> Result<File, JournalError> {
    let tmp = dir.join(format!("{FILE_NAME}.new"));
    let mut out = String::new();
    for r in records {
        out.push_str(&encode(&r));
    }
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(out.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    OpenOptions::new().append(true).open(path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::gateway::PowerState;

    fn done(detail: &str) -> PowerOutcome {
        PowerOutcome::Done {
            state: PowerState::On,
            confirmed_off_unix_ms: None,
            detail: detail.into(),
        }
    }

    #[test]
    fn a_state_dir_that_is_a_file_is_named_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("state");
        std::fs::write(&file, "").unwrap();
        let e = Journal::open(&file, 8).map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("is not a directory") && e.contains(&file.display().to_string()),
            "{e}"
        );
    }

    fn started(id: &str) -> Record {
        Record::Started {
            id: id.into(),
            fingerprint: format!("m|{id}"),
        }
    }

    fn finished(id: &str) -> Record {
        Record::Finished {
            id: id.into(),
            fingerprint: format!("m|{id}"),
            outcome: done(id),
        }
    }

    fn ids(l: &Loaded) -> Vec<&str> {
        l.finished.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn reload_answers_finished_and_marks_interrupted_ids() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, l) = Journal::open(dir.path(), 10).unwrap();
        assert!(l.finished.is_empty());
        for r in [started("a"), finished("a"), started("b")] {
            j.append(&r).unwrap();
        }
        drop(j); // as if killed: "b" never finished
        let (_, l) = Journal::open(dir.path(), 10).unwrap();
        assert_eq!(ids(&l), ["a", "b"]);
        assert_eq!(l.finished[0].outcome, done("a"));
        assert_eq!(l.finished[0].fingerprint, "m|a");
        assert_eq!(l.interrupted, ["b"]);
        assert!(
            matches!(&l.finished[1].outcome, PowerOutcome::Failed { detail, retriable: false } if detail.starts_with("outcome unknown")),
            "{:?}",
            l.finished[1]
        );
        // The interrupted id was recorded as finished: a second restart says the same.
        let (_, again) = Journal::open(dir.path(), 10).unwrap();
        assert!(again.interrupted.is_empty());
        assert_eq!(again.finished, l.finished);
    }

    #[test]
    fn the_highest_epoch_of_each_store_survives_reopening_and_compaction() {
        let tmp = tempfile::tempdir().unwrap();
        let epoch = |store: &str, epoch| Record::Epoch {
            store: store.into(),
            epoch,
        };
        {
            let (mut j, _) = Journal::open(tmp.path(), 2).unwrap();
            j.append(&epoch("s1", 41)).unwrap();
            j.append(&epoch("s1", 42)).unwrap();
            j.append(&epoch("s2", 7)).unwrap();
            // Far more finished ids than the capacity: compaction runs several times.
            for i in 0..20 {
                j.append(&started(&format!("r{i}"))).unwrap();
                j.append(&finished(&format!("r{i}"))).unwrap();
            }
        }
        let (_j, loaded) = Journal::open(tmp.path(), 2).unwrap();
        assert_eq!(loaded.epochs.get("s1"), Some(42));
        assert_eq!(loaded.epochs.get("s2"), Some(7));
        assert_eq!(ids(&loaded), vec!["r18", "r19"]);
        drop(_j);
        // And once more, from the compacted file.
        let (_j, loaded) = Journal::open(tmp.path(), 2).unwrap();
        assert_eq!(loaded.epochs.get("s1"), Some(42));
        assert_eq!(loaded.epochs.len(), 2);
    }

    #[test]
    fn a_torn_tail_and_a_garbled_line_are_skipped_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path(), 10).unwrap();
        j.append(&started("a")).unwrap();
        j.append(&finished("a")).unwrap();
        drop(j);
        let path = dir.path().join(FILE_NAME);
        let mut text = std::fs::read_to_string(&path).unwrap();
        // A flipped byte inside a whole line, then a record cut short mid-write.
        let good = encode(&finished("b"));
        text.push_str(&good.replacen("m|b", "m|x", 1));
        let cut = encode(&finished("c"));
        text.push_str(&cut[..cut.len() / 2]);
        std::fs::write(&path, text).unwrap();
        let (mut j, l) = Journal::open(dir.path(), 10).unwrap();
        assert_eq!(ids(&l), ["a"]);
        assert_eq!(l.skipped, 2);
        // The torn tail is gone: the next record is a whole line of its own.
        j.append(&finished("d")).unwrap();
        drop(j);
        let (_, l) = Journal::open(dir.path(), 10).unwrap();
        assert_eq!(ids(&l), ["a", "d"]);
        assert_eq!(l.skipped, 0);
    }

    #[test]
    fn compaction_keeps_the_newest_ids_and_running_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path(), 3).unwrap();
        j.append(&started("run")).unwrap();
        for i in 0..40 {
            let id = format!("id{i}");
            j.append(&started(&id)).unwrap();
            j.append(&finished(&id)).unwrap();
        }
        // Bounded on disk while running: compacted at 2 × 3 + 16 lines.
        let lines = std::fs::read_to_string(j.path()).unwrap().lines().count();
        assert!(lines <= 2 * 3 + 16 + 1, "{lines} lines");
        j.compact().unwrap();
        let text = std::fs::read_to_string(j.path()).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        drop(j);
        let (_, l) = Journal::open(dir.path(), 3).unwrap();
        // "run" is still remembered (now interrupted) with the newest three.
        assert_eq!(ids(&l), ["run", "id37", "id38", "id39"][..].to_vec());
        assert_eq!(l.interrupted, ["run"]);
    }

    #[test]
    fn a_second_record_on_the_same_directory_is_refused_while_the_first_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(dir.path(), 10).unwrap();
        let e = Journal::open(dir.path(), 10).unwrap_err();
        assert!(matches!(e, JournalError::Locked { .. }), "{e}");
        assert!(e.is_retriable());
        drop(j);
        Journal::open(dir.path(), 10).unwrap();
    }

    #[test]
    fn an_unwritable_state_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "x").unwrap();
        let e = Journal::open(&file, 3).unwrap_err();
        assert!(e.to_string().contains("not-a-dir"), "{e}");
    }
}
