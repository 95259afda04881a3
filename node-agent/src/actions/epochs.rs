//! The highest fencing epoch this agent has seen per coordinator store identity, so that a
//! coordinator that lost the lead and has not noticed yet cannot have anything done here
//! (see [`protocol::fencing`]).
//!
//! Kept in memory and in `coordinator-epochs` under the state directory, one
//! `<store identity> <epoch>` line per store. A request that raises an epoch is acted on only
//! after the file is rewritten (a temporary file, fsync'ed, renamed over the old one, the
//! directory fsync'ed), so an agent restarted between a new coordinator and an old one still
//! refuses the old one. A file that cannot be read refuses every action that carries a token
//! until it can be (an empty record would let an older epoch through), and says which file
//! and why.

use std::io::Write;
use std::path::{Path, PathBuf};

use protocol::actions::{ActionFailure, ActionStatus};
use protocol::fencing::{Epochs, FencingToken, Verdict};

/// The record's file under the state directory.
pub const FILE: &str = "coordinator-epochs";

/// The epochs seen, and where they are kept.
#[derive(Debug)]
pub struct EpochRecord {
    dir: PathBuf,
    epochs: Epochs,
    /// Why the file could not be read, while it cannot.
    unreadable: Option<String>,
}

fn parse(text: &str, path: &Path) -> Result<Epochs, String> {
    let mut e = Epochs::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let parsed = line
            .split_once(' ')
            .and_then(|(s, v)| Some((s, v.trim().parse::<u64>().ok()?)));
        let Some((store, epoch)) = parsed else {
            return Err(format!(
                "{} line {}: {line:?} is not `<store identity> <epoch>`",
                path.display(),
                n + 1
            ));
        };
        e.raise(store, epoch);
    }
    Ok(e)
}

fn read(dir: &Path) -> Result<Epochs, String> {
    let path = dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Epochs::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn write(dir: &Path, epochs: &Epochs) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{FILE}.new"));
    let mut text = String::new();
    for (store, epoch) in epochs.iter() {
        text.push_str(&format!("{store} {epoch}\n"));
    }
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

impl EpochRecord {
    /// Reads the record in `dir` (none yet: no epoch seen).
    pub fn load(dir: &Path) -> Self {
        let (epochs, unreadable) = match read(dir) {
            Ok(e) => (e, None),
            Err(e) => {
                tracing::warn!(error = %e, "the fencing epoch record cannot be read: every action is refused until it can be; check the agent's state directory");
                (Epochs::new(), Some(e))
            }
        };
        Self {
            dir: dir.to_path_buf(),
            epochs,
            unreadable,
        }
    }

    /// Keeps the record in `dir` from now on (a reload changed `state_dir`): what the new
    /// directory holds is merged with what is known, and written there.
    pub fn move_to(&mut self, dir: &Path) {
        if dir == self.dir {
            return;
        }
        let mut moved = Self::load(dir);
        for (store, epoch) in self.epochs.iter() {
            moved.epochs.raise(store, epoch);
        }
        if moved.unreadable.is_none()
            && let Err(e) = write(dir, &moved.epochs)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write the fencing epoch record in the new state directory; it is written at the next new epoch");
        }
        *self = moved;
    }

    /// Judges `token`: `Ok` to act (a raised epoch is on disk first), `Err` with the answer
    /// to send instead: an older epoch ([`ActionFailure::OlderEpoch`]) or a record that
    /// cannot be read or written ([`ActionFailure::Error`]).
    pub fn admit(&mut self, token: &FencingToken) -> Result<(), ActionStatus> {
        if self.unreadable.is_some() {
            match read(&self.dir) {
                Ok(e) => {
                    self.epochs = e;
                    self.unreadable = None;
                }
                Err(e) => {
                    return Err(ActionStatus::Failed {
                        code: ActionFailure::Error,
                        detail: format!(
                            "not acting: the fencing epoch record cannot be read ({e}); check the agent's state directory"
                        ),
                    });
                }
            }
        }
        match self.epochs.judge(token) {
            Verdict::Current => Ok(()),
            Verdict::Older(detail) => Err(ActionStatus::Failed {
                code: ActionFailure::OlderEpoch,
                detail,
            }),
            Verdict::Newer => {
                let mut raised = self.epochs.clone();
                raised.raise(&token.store, token.epoch);
                if let Err(e) = write(&self.dir, &raised) {
                    return Err(ActionStatus::Failed {
                        code: ActionFailure::Error,
                        detail: format!(
                            "not acting: cannot record {token} in {}: {e}; check the agent's state directory",
                            self.dir.join(FILE).display()
                        ),
                    });
                }
                tracing::info!(store = %token.store, epoch = token.epoch, before = self.epochs.get(&token.store), "a coordinator of a newer fencing epoch asked; older epochs of its store are refused from now on");
                self.epochs = raised;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(epoch: u64) -> FencingToken {
        FencingToken {
            store: "s1".into(),
            epoch,
        }
    }

    #[test]
    fn an_older_epoch_is_refused_also_after_the_agent_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = EpochRecord::load(dir.path());
        assert!(r.admit(&t(42)).is_ok());
        assert!(r.admit(&t(42)).is_ok());
        let again = EpochRecord::load(dir.path()).admit(&t(41));
        let Err(ActionStatus::Failed { code, detail }) = again else {
            panic!("41 after 42 was not refused: {again:?}");
        };
        assert_eq!(code, ActionFailure::OlderEpoch);
        assert!(
            detail.starts_with("refused: epoch 41 is older than 42 for store s1"),
            "{detail}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE)).unwrap(),
            "s1 42\n"
        );
    }

    #[test]
    fn an_unreadable_record_refuses_until_it_can_be_read_and_a_move_keeps_the_epochs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "s1 forty-two\n").unwrap();
        let mut r = EpochRecord::load(dir.path());
        let Err(ActionStatus::Failed { code, detail }) = r.admit(&t(50)) else {
            panic!("acted on an unreadable record");
        };
        assert_eq!(code, ActionFailure::Error);
        assert!(
            detail.contains("line 1") && detail.contains(FILE),
            "{detail}"
        );
        std::fs::write(dir.path().join(FILE), "s1 42\n").unwrap();
        assert!(r.admit(&t(41)).is_err());
        assert!(r.admit(&t(43)).is_ok());
        let other = tempfile::tempdir().unwrap();
        r.move_to(other.path());
        assert!(EpochRecord::load(other.path()).admit(&t(42)).is_err());
    }
}
