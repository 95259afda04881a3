//! Why the request record, or the state directory's lock that guards it
//! ([`crate::state_lock`]), could not be read or written. Its own file so that the lock can
//! name these errors without importing the record.

use std::path::{Path, PathBuf};

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// File system error.
    #[error("request record {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Another process (a second gateway) holds the state directory.
    #[error(
        "state_dir {dir} is in use by another bmc-gateway ({}, holding {lock}): two gateways on \
         one state directory could each run a request id the other ran; stop the other, or give \
         each its own state_dir",
        holder.map_or("pid unknown".to_string(), |p| format!("pid {p}"))
    )]
    Locked {
        /// The state directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// The pid written in the lock file by its holder.
        holder: Option<u32>,
    },
}

impl JournalError {
    /// True when trying again may succeed (a full disk may be freed, the other gateway may
    /// stop); the gateway refuses to execute a request it could not record either way.
    pub fn is_retriable(&self) -> bool {
        true
    }
}

/// The [`JournalError::Io`] of an operation on `path`.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}
