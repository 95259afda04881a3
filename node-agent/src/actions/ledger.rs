//! Which action requests the agent has seen, so a resent request is answered and not
//! carried out again.
//!
//! Every id is remembered in memory (the last [`REMEMBERED`]): a coordinator resends within
//! one step, while the agent runs. Reboots and restarts are also written, fsync'ed, to a
//! small file each in the state directory *before* their command runs, so the answer
//! survives the agent itself:
//! - `reboot-requests`: after the reboot the request caused, the same id is answered with
//!   the recorded outcome instead of rebooting again;
//! - `restart-requests`: a restart is written as running, then with its outcome. An id
//!   still written as running when the agent starts was interrupted (the agent was killed,
//!   crashed or stopped while the command ran): it is answered "outcome unknown"
//!   ([`protocol::actions::OUTCOME_UNKNOWN`]) and not run again.
//!
//! Diagnostics change nothing on the node and are remembered in memory only. Each file is
//! rewritten whole (a few dozen lines) through a temporary file and a rename, so a crash
//! leaves the old or the new one.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use protocol::actions::{ActionFailure, ActionStatus, OUTCOME_UNKNOWN};
use tokio::sync::watch;

/// Request ids remembered in memory. A repair step resends one id a few times; 256 covers
/// every step of every entry a machine can have in flight, at a few KiB.
const REMEMBERED: usize = 256;

/// Reboot records kept in the file; older lines are dropped when it is rewritten.
const REBOOTS_KEPT: usize = 32;

/// Restart records kept in the file: a coordinator resends an id within one step (minutes),
/// and a machine sees a handful of restarts a day, so 64 is days of them in ~8 KiB.
const RESTARTS_KEPT: usize = 64;

/// The reboot record's file under the state directory.
const REBOOT_FILE: &str = "reboot-requests";

/// The restart record's file under the state directory.
const RESTART_FILE: &str = "restart-requests";

/// What [`Ledger::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// A new id: act, then call [`Ledger::finish`].
    New,
    /// Seen before: this is (or will be) its answer.
    Seen(watch::Receiver<Option<ActionStatus>>),
}

/// Errors of the reboot and restart records.
#[derive(Debug, thiserror::Error)]
#[error("cannot {doing} the {what} {path}: {source}; check the agent's state directory")]
pub struct LedgerError {
    /// `read`, `write` or `use`.
    pub doing: &'static str,
    /// `reboot record` or `restart record`.
    pub what: &'static str,
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

/// One file of `id<TAB>outcome` lines, oldest first.
#[derive(Debug)]
struct Record {
    file: &'static str,
    what: &'static str,
    kept: usize,
    entries: Vec<(String, String)>,
    /// Why the file could not be read, while it cannot: it is then not rewritten over
    /// records it may hold (and a reboot is refused rather than risk acting twice).
    unread: Option<std::io::Error>,
}

/// The records in the file; none when there is no file. Bytes that are not UTF-8 (a torn
/// write) spoil only their own line.
fn read_entries(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(parse_entries(&String::from_utf8_lossy(&bytes))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn parse_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let (id, outcome) = l.split_once('\t')?;
            (!id.is_empty()).then(|| (id.to_string(), outcome.to_string()))
        })
        .collect()
}

impl Record {
    fn load(dir: &Path, file: &'static str, what: &'static str, kept: usize) -> Self {
        let path = dir.join(file);
        let (entries, unread) = match read_entries(&path) {
            Ok(r) => (r, None),
            Err(e) => {
                let meanwhile = if file == REBOOT_FILE {
                    "reboot requests are refused until it can be read"
                } else {
                    "restart ids are kept in memory only until it can be read"
                };
                tracing::warn!(path = %path.display(), error = %e, "cannot read the {what}: {meanwhile}");
                (Vec::new(), Some(e))
            }
        };
        Self {
            file,
            what,
            kept,
            entries,
            unread,
        }
    }

    fn find(&self, id: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, o)| o.as_str())
    }

    /// Takes `moved` (the record of new state directory `dir`) and keeps the entries known
    /// so far after its own, written there at once: a request running now must not be
    /// forgotten if the agent dies before its outcome is written.
    fn move_to(&mut self, dir: &Path, moved: Record) {
        let mine = std::mem::replace(&mut self.entries, moved.entries);
        let mut added = false;
        for r in mine {
            if self.find(&r.0).is_none() {
                self.entries.push(r);
                added = true;
            }
        }
        self.unread = moved.unread;
        if added
            && self.unread.is_none()
            && let Err(e) = self.flush(dir)
        {
            tracing::warn!(error = %e, "cannot write the {} in the new state directory; the ids are kept in memory until the next record", self.what);
        }
    }

    /// Reads the file again if it could not be read before. `Err` while it still cannot.
    fn reread(&mut self, dir: &Path) -> Result<(), LedgerError> {
        if self.unread.is_none() {
            return Ok(());
        }
        let path = dir.join(self.file);
        match read_entries(&path) {
            Ok(r) => {
                self.unread = None;
                // Records made since (none can be written while unread) stay last.
                let mine = std::mem::replace(&mut self.entries, r);
                self.entries.extend(mine);
                Ok(())
            }
            Err(source) => Err(LedgerError {
                doing: "read",
                what: self.what,
                path,
                source,
            }),
        }
    }

    /// Writes `id` with `outcome` (tabs and newlines become spaces) and syncs the file.
    fn write(&mut self, dir: &Path, id: &str, outcome: &str) -> Result<(), LedgerError> {
        let path = dir.join(self.file);
        if self.unread.is_some() {
            self.reread(dir)?;
            if self.find(id).is_some() {
                return Err(LedgerError {
                    doing: "use",
                    what: self.what,
                    path,
                    source: std::io::Error::other(format!(
                        "it says request {id} was made before; not carried out again"
                    )),
                });
            }
        }
        let outcome = outcome.replace(['\t', '\n'], " ");
        self.entries.retain(|(i, _)| i != id);
        self.entries.push((id.to_string(), outcome));
        self.flush(dir)
    }

    /// Writes the newest entries (at most `kept`) to the file, through a synced temporary
    /// file and a rename.
    fn flush(&mut self, dir: &Path) -> Result<(), LedgerError> {
        let path = dir.join(self.file);
        let skip = self.entries.len().saturating_sub(self.kept);
        self.entries.drain(..skip);
        let tmp = dir.join(format!("{}.tmp", self.file));
        let err = |source| LedgerError {
            doing: "write",
            what: self.what,
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        for (i, o) in &self.entries {
            writeln!(f, "{i}\t{o}").map_err(err)?;
        }
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Seen request ids and their answers.
#[derive(Debug)]
pub struct Ledger {
    state_dir: PathBuf,
    seen: HashMap<String, watch::Sender<Option<ActionStatus>>>,
    order: VecDeque<String>,
    reboots: Record,
    restarts: Record,
    /// The boot this agent runs in: a reboot recorded as asked in this same boot, and not
    /// finished, was interrupted by the agent's stop without rebooting.
    boot: String,
}

impl Ledger {
    /// A ledger with the records found in `state_dir`. A file that exists but cannot be read
    /// is said in the log and read again at the next request; until then every reboot is
    /// refused ([`Self::record_reboot`]) and restarts are remembered in memory only.
    pub fn load(state_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            seen: HashMap::new(),
            order: VecDeque::new(),
            reboots: Record::load(state_dir, REBOOT_FILE, "reboot record", REBOOTS_KEPT),
            restarts: Record::load(state_dir, RESTART_FILE, "restart record", RESTARTS_KEPT),
            boot: String::new(),
        }
    }

    /// Tells the ledger the boot id the agent runs in (empty when unknown).
    pub fn set_boot(&mut self, boot: &str) {
        self.boot = boot.to_string();
    }

    /// Keeps the records in `state_dir` from now on (a reload changed it): the records found
    /// there are read, and the ones known so far are kept too and written there with the
    /// next record, so a request seen in either directory is not carried out again.
    pub fn move_to(&mut self, state_dir: &Path) {
        if state_dir == self.state_dir {
            return;
        }
        let moved = Self::load(state_dir);
        self.reboots.move_to(state_dir, moved.reboots);
        self.restarts.move_to(state_dir, moved.restarts);
        self.state_dir = state_dir.to_path_buf();
    }

    /// Looks `id` up (in memory, then in the records); a new id is marked in progress.
    pub fn begin(&mut self, id: &str) -> Begin {
        if let Some(tx) = self.seen.get(id) {
            return Begin::Seen(tx.subscribe());
        }
        let _ = self.restarts.reread(&self.state_dir);
        let recorded = match (self.reboots.find(id), self.restarts.find(id)) {
            (Some(outcome), _) => Some(reboot_answer(outcome, &self.boot)),
            (None, Some(outcome)) => Some(restart_answer(outcome)),
            (None, None) => None,
        };
        if let Some(answer) = recorded {
            let (tx, rx) = watch::channel(Some(answer));
            self.remember(id, tx);
            return Begin::Seen(rx);
        }
        let (tx, _) = watch::channel(None);
        self.remember(id, tx);
        Begin::New
    }

    /// The answer of `id` as it comes (`None` while in progress), if `id` is remembered.
    pub fn watch(&self, id: &str) -> Option<watch::Receiver<Option<ActionStatus>>> {
        self.seen.get(id).map(watch::Sender::subscribe)
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
    /// syncs it. Called before the reboot command runs, and again with its result.
    pub fn record_reboot(&mut self, id: &str, outcome: &str) -> Result<(), LedgerError> {
        self.reboots.write(&self.state_dir, id, outcome)
    }

    /// Writes restart `id` as running `what` (one line) and syncs the record: called before
    /// the command runs. `Err` when the record cannot be written; the caller decides.
    pub fn record_restart_running(&mut self, id: &str, what: &str) -> Result<(), LedgerError> {
        self.restarts
            .write(&self.state_dir, id, &format!("running {what}"))
    }

    /// Writes the outcome of restart `id` (its first line) to the record.
    pub fn record_restart_outcome(
        &mut self,
        id: &str,
        status: &ActionStatus,
    ) -> Result<(), LedgerError> {
        let line = match status {
            ActionStatus::Failed { code, detail } => {
                format!("failed {} {}", code.as_str(), first_line(detail))
            }
            ActionStatus::Done { detail } => format!("done {}", first_line(detail)),
            other => format!("done {other:?}"),
        };
        self.restarts.write(&self.state_dir, id, &line)
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// The outcome line written before the reboot command runs.
pub fn reboot_asked(boot: &str) -> String {
    format!("asked during boot {boot}")
}

/// The answer to a reboot request found in the record. One asked in `boot` (the boot the
/// agent runs in now) whose command never finished was interrupted by the agent's stop
/// (killed, crashed, restarted) and the machine did not reboot: outcome unknown, so the
/// coordinator's step fails in seconds instead of waiting out its limit for a new boot.
fn reboot_answer(outcome: &str, boot: &str) -> ActionStatus {
    let asked_here = reboot_asked(boot);
    let same_boot = outcome == asked_here
        || outcome
            .strip_prefix(&asked_here)
            .is_some_and(|rest| rest.starts_with(';'));
    if !boot.is_empty() && same_boot {
        return ActionStatus::Failed {
            code: ActionFailure::Error,
            detail: format!(
                "{OUTCOME_UNKNOWN}reboot: the agent stopped while the reboot command ran and the machine is still in boot {boot}, so it did not reboot; not run again for this request id"
            ),
        };
    }
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

/// The answer to a restart request found in the record: its outcome, or, for one written
/// as running (the agent stopped before it could write the outcome), outcome unknown.
fn restart_answer(outcome: &str) -> ActionStatus {
    if let Some(done) = outcome.strip_prefix("done ") {
        return ActionStatus::Done {
            detail: done.to_string(),
        };
    }
    if let Some(failed) = outcome.strip_prefix("failed ") {
        let (code, detail) = failed.split_once(' ').unwrap_or((failed, ""));
        let code = [
            ActionFailure::NotAllowed,
            ActionFailure::BadRequest,
            ActionFailure::CommandFailed,
            ActionFailure::TimedOut,
        ]
        .into_iter()
        .find(|c| c.as_str() == code)
        .unwrap_or(ActionFailure::Error);
        return ActionStatus::Failed {
            code,
            detail: detail.to_string(),
        };
    }
    let what = outcome.strip_prefix("running ").unwrap_or(outcome);
    ActionStatus::Failed {
        code: ActionFailure::Error,
        detail: format!(
            "{OUTCOME_UNKNOWN}{what}: the agent stopped (killed, crashed or restarted) while the command ran, so whether the unit was restarted is not known; not run again for this request id"
        ),
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
        assert!(l.reboots.unread.is_none());
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

    #[test]
    fn a_restart_interrupted_by_an_agent_stop_is_answered_outcome_unknown_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::load(dir.path());
        assert!(matches!(l.begin("a"), Begin::New));
        l.record_restart_running("a", "restart-unit kubelet with `x kubelet` during boot b1")
            .unwrap();
        assert!(matches!(l.begin("b"), Begin::New));
        l.record_restart_running("b", "restart-unit containerd")
            .unwrap();
        let done = ActionStatus::Failed {
            code: ActionFailure::TimedOut,
            detail: "restart-unit containerd: `x` did not finish\nout".into(),
        };
        l.record_restart_outcome("b", &done).unwrap();
        // The agent was killed while "a" ran: started again, it knows both.
        let mut again = Ledger::load(dir.path());
        let Begin::Seen(rx) = again.begin("a") else {
            panic!("interrupted restart forgotten")
        };
        let a = rx.borrow().clone().unwrap();
        assert!(a.is_outcome_unknown(), "{a:?}");
        let Begin::Seen(rx) = again.begin("b") else {
            panic!("finished restart forgotten")
        };
        assert_eq!(
            rx.borrow().clone().unwrap(),
            ActionStatus::Failed {
                code: ActionFailure::TimedOut,
                detail: "restart-unit containerd: `x` did not finish".into()
            }
        );
        assert!(matches!(again.begin("c"), Begin::New));
    }

    #[test]
    fn the_restart_record_is_bounded_and_its_absence_only_costs_durability() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::load(dir.path());
        for i in 0..(RESTARTS_KEPT + 5) {
            l.record_restart_running(&i.to_string(), "restart-unit kubelet")
                .unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join(RESTART_FILE)).unwrap();
        assert_eq!(text.lines().count(), RESTARTS_KEPT);
        // A state directory that is a file: the write fails, the id is still remembered.
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let mut l = Ledger::load(&file);
        assert!(matches!(l.begin("x"), Begin::New));
        assert!(
            l.record_restart_running("x", "restart-unit kubelet")
                .is_err()
        );
        assert!(matches!(l.begin("x"), Begin::Seen(_)));
    }

    #[test]
    fn a_reboot_asked_in_this_very_boot_and_never_finished_is_outcome_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::load(dir.path());
        l.record_reboot("r1", &reboot_asked("b1")).unwrap();
        l.record_reboot(
            "r2",
            &format!("{}; the agent was stopped", reboot_asked("b1")),
        )
        .unwrap();
        l.record_reboot("r3", &reboot_asked("b10")).unwrap();
        for (boot, unknown) in [("b1", ["r1", "r2"]), ("b2", ["", ""])] {
            let mut again = Ledger::load(dir.path());
            again.set_boot(boot);
            for id in ["r1", "r2", "r3"] {
                let Begin::Seen(rx) = again.begin(id) else {
                    panic!("{id} forgotten")
                };
                let answer = rx.borrow().clone().unwrap();
                assert_eq!(
                    answer.is_outcome_unknown(),
                    unknown.contains(&id),
                    "{boot} {id}: {answer:?}"
                );
            }
        }
    }
}
