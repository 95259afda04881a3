//! Which action requests the agent has seen, so a resent request is answered and not
//! carried out again.
//!
//! Restarts and diagnostics are remembered in memory (the last [`REMEMBERED`] ids): a
//! coordinator resends within one step, while the agent runs. Reboots are also written,
//! fsync'ed, to a small file in the state directory *before* the reboot command runs, so the
//! answer survives the reboot the request caused: after it, the same id is answered with the
//! recorded outcome instead of rebooting again.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use protocol::actions::{ActionFailure, ActionStatus};
use tokio::sync::watch;

/// Request ids remembered in memory. A repair step resends one id a few times; 256 covers
/// every step of every entry a machine can have in flight, at a few KiB.
const REMEMBERED: usize = 256;

/// Reboot records kept in the file; older lines are dropped when it is rewritten.
const REBOOTS_KEPT: usize = 32;

/// The file under the state directory.
const REBOOT_FILE: &str = "reboot-requests";

/// What [`Ledger::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// A new id: act, then call [`Ledger::finish`].
    New,
    /// Seen before: this is (or will be) its answer.
    Seen(watch::Receiver<Option<ActionStatus>>),
}

/// Errors of the reboot record.
#[derive(Debug, thiserror::Error)]
#[error("cannot {doing} the reboot record {path}: {source}; check the agent's state directory")]
pub struct LedgerError {
    /// `read` or `write`.
    pub doing: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Cause.
    #[source]
    pub source: std::io::Error,
}

impl LedgerError {
    /// A full or read-only disk does not heal by retrying at once.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// Seen request ids and their answers.
#[derive(Debug)]
pub struct Ledger {
    state_dir: PathBuf,
    seen: HashMap<String, watch::Sender<Option<ActionStatus>>>,
    order: VecDeque<String>,
    /// `(id, outcome line)` from the file, oldest first.
    reboots: Vec<(String, String)>,
    /// Why the file could not be read, while it cannot: a reboot is then refused rather than
    /// risk carrying out a resent request twice, and the file is not rewritten over records
    /// it may hold.
    unread: Option<std::io::Error>,
}

/// The records in the file; none when there is no file. Bytes that are not UTF-8 (a torn
/// write) spoil only their own line.
fn read_reboots(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(parse_reboots(&String::from_utf8_lossy(&bytes))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

impl Ledger {
    /// A ledger with the reboot records found in `state_dir`. A file that exists but cannot
    /// be read is said in the log, read again at the next reboot request, and until then
    /// every reboot is refused ([`Self::record_reboot`]).
    pub fn load(state_dir: &Path) -> Self {
        let path = state_dir.join(REBOOT_FILE);
        let (reboots, unread) = match read_reboots(&path) {
            Ok(r) => (r, None),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the reboot record: reboot requests are refused until it can be read");
                (Vec::new(), Some(e))
            }
        };
        Self {
            state_dir: state_dir.to_path_buf(),
            seen: HashMap::new(),
            order: VecDeque::new(),
            reboots,
            unread,
        }
    }

    /// Keeps the reboot record in `state_dir` from now on (a reload changed it): the records
    /// found there are read, and the ones known so far are kept too and written there with
    /// the next record, so a request seen in either directory is not carried out again.
    pub fn move_to(&mut self, state_dir: &Path) {
        if state_dir == self.state_dir {
            return;
        }
        let moved = Self::load(state_dir);
        let mine = std::mem::replace(&mut self.reboots, moved.reboots);
        for r in mine {
            if !self.reboots.iter().any(|(i, _)| *i == r.0) {
                self.reboots.push(r);
            }
        }
        self.unread = moved.unread;
        self.state_dir = state_dir.to_path_buf();
    }

    /// Looks `id` up; a new id is marked in progress.
    pub fn begin(&mut self, id: &str) -> Begin {
        if let Some(tx) = self.seen.get(id) {
            return Begin::Seen(tx.subscribe());
        }
        if let Some((_, outcome)) = self.reboots.iter().find(|(i, _)| i == id) {
            let (tx, rx) = watch::channel(Some(reboot_answer(outcome)));
            self.remember(id, tx);
            return Begin::Seen(rx);
        }
        let (tx, _) = watch::channel(None);
        self.remember(id, tx);
        Begin::New
    }

    fn remember(&mut self, id: &str, tx: watch::Sender<Option<ActionStatus>>) {
        if self.order.len() >= REMEMBERED
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.order.push_back(id.to_string());
        self.seen.insert(id.to_string(), tx);
    }

    /// Records the final answer for `id`; waiters on a resend get it.
    pub fn finish(&mut self, id: &str, status: ActionStatus) {
        if let Some(tx) = self.seen.get(id) {
            tx.send_replace(Some(status));
        }
    }

    /// Writes `id` with `outcome` (one line, no tabs or newlines) to the reboot record and
    /// syncs it. Called with `pending` before the reboot command runs, and again with its
    /// result.
    pub fn record_reboot(&mut self, id: &str, outcome: &str) -> Result<(), LedgerError> {
        let path = self.state_dir.join(REBOOT_FILE);
        if self.unread.is_some() {
            match read_reboots(&path) {
                Ok(r) => {
                    self.unread = None;
                    // Records made since (none can be: every one was refused) stay last.
                    let mine = std::mem::replace(&mut self.reboots, r);
                    self.reboots.extend(mine);
                    if self.reboots.iter().any(|(i, _)| i == id) {
                        return Err(LedgerError {
                            doing: "use",
                            path,
                            source: std::io::Error::other(format!(
                                "it says request {id} was made before; not carried out again"
                            )),
                        });
                    }
                }
                Err(source) => {
                    return Err(LedgerError {
                        doing: "read",
                        path,
                        source,
                    });
                }
            }
        }
        let outcome = outcome.replace(['\t', '\n'], " ");
        self.reboots.retain(|(i, _)| i != id);
        self.reboots.push((id.to_string(), outcome));
        let skip = self.reboots.len().saturating_sub(REBOOTS_KEPT);
        self.reboots.drain(..skip);
        let tmp = self.state_dir.join(format!("{REBOOT_FILE}.tmp"));
        let err = |source| LedgerError {
            doing: "write",
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.state_dir).map_err(err)?;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        for (i, o) in &self.reboots {
            writeln!(f, "{i}\t{o}").map_err(err)?;
        }
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)?;
        if let Ok(d) = std::fs::File::open(&self.state_dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

fn parse_reboots(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let (id, outcome) = l.split_once('\t')?;
            (!id.is_empty()).then(|| (id.to_string(), outcome.to_string()))
        })
        .collect()
}

/// The answer to a reboot request found in the record.
fn reboot_answer(outcome: &str) -> ActionStatus {
    match outcome.strip_prefix("failed ") {
        Some(detail) => ActionStatus::Failed {
            code: ActionFailure::CommandFailed,
            detail: format!("this reboot request failed earlier: {detail}"),
        },
        None => ActionStatus::Done {
            detail: format!("reboot already carried out for this request ({outcome})"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resent_id_is_seen_and_gets_the_first_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::load(dir.path());
        assert!(matches!(l.begin("a"), Begin::New));
        let Begin::Seen(rx) = l.begin("a") else {
            panic!("resend not seen")
        };
        assert_eq!(*rx.borrow(), None, "still in progress");
        l.finish(
            "a",
            ActionStatus::Done {
                detail: "ok".into(),
            },
        );
        let Begin::Seen(rx) = l.begin("a") else {
            panic!()
        };
        assert!(matches!(*rx.borrow(), Some(ActionStatus::Done { .. })));
    }

    #[test]
    fn reboot_ids_survive_a_restart_of_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::load(dir.path());
        assert!(matches!(l.begin("r1"), Begin::New));
        l.record_reboot("r1", "pending boot id b1").unwrap();
        l.record_reboot("r2", "failed exit status 1").unwrap();
        let mut again = Ledger::load(dir.path());
        match again.begin("r1") {
            Begin::Seen(rx) => assert!(matches!(*rx.borrow(), Some(ActionStatus::Done { .. }))),
            Begin::New => panic!("reboot id forgotten across a restart"),
        }
        match again.begin("r2") {
            Begin::Seen(rx) => {
                assert!(matches!(*rx.borrow(), Some(ActionStatus::Failed { .. })))
            }
            Begin::New => panic!("failed reboot id forgotten"),
        }
        assert!(matches!(again.begin("r3"), Begin::New));
    }

    #[test]
    fn an_unreadable_record_refuses_reboots_until_it_can_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(REBOOT_FILE);
        // A path that exists and cannot be read as a file (root reads any mode, so not chmod).
        std::fs::create_dir(&file).unwrap();
        let mut l = Ledger::load(dir.path());
        assert!(matches!(l.begin("r2"), Begin::New));
        let e = l.record_reboot("r2", "pending").unwrap_err();
        assert_eq!(e.doing, "read");
        assert!(
            e.to_string().contains("cannot read the reboot record"),
            "{e}"
        );
        assert!(file.is_dir(), "nothing written over it");
        // Readable again, holding r1 from before: r2 goes ahead and r1 is kept ...
        std::fs::remove_dir(&file).unwrap();
        std::fs::write(&file, "r1\tpending boot id b1\n").unwrap();
        l.record_reboot("r2", "pending boot id b2").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("r1\t") && text.contains("r2\t"), "{text}");
        // ... and a request the file names is never carried out again.
        let mut l = Ledger::load(dir.path());
        std::fs::rename(&file, dir.path().join("moved")).unwrap();
        std::fs::create_dir(&file).unwrap();
        let mut stale = Ledger::load(dir.path());
        std::fs::remove_dir(&file).unwrap();
        std::fs::rename(dir.path().join("moved"), &file).unwrap();
        assert!(stale.record_reboot("r1", "pending").is_err());
        assert!(matches!(l.begin("r1"), Begin::Seen(_)));
    }

    #[test]
    fn a_torn_line_spoils_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = b"r1\tpending boot id b1\n".to_vec();
        bytes.extend_from_slice(b"r\xff\xfe2\tpen");
        std::fs::write(dir.path().join(REBOOT_FILE), bytes).unwrap();
        let mut l = Ledger::load(dir.path());
        assert!(l.unread.is_none());
        assert!(matches!(l.begin("r1"), Begin::Seen(_)));
    }

    #[test]
    fn memory_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::load(dir.path());
        for i in 0..(REMEMBERED + 10) {
            let _ = l.begin(&i.to_string());
        }
        assert_eq!(l.seen.len(), REMEMBERED);
        assert!(matches!(l.begin("0"), Begin::New), "oldest forgotten");
    }
}
