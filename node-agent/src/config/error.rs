//! Why the configuration did not load. Its own file so that each area's configuration
//! (`actions::config`, `checks::config`) can say so without importing what assembles them.

use std::path::PathBuf;

/// Errors loading the configuration. All of them end the agent with exit code 64.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this configuration (unknown key, wrong type, …).
    #[error("invalid config file {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, naming the key and line.
        detail: String,
    },
    /// A value is missing or invalid after merging file, environment and flags.
    #[error("invalid setting `{key}` ({origin}): {detail}")]
    Invalid {
        /// The key (as in the file; flags and env use the same name).
        key: &'static str,
        /// Where the value came from (`flag --ca`, `env FLEETMEND_AGENT_CA`, `file PATH`),
        /// or where it could have been set when it is missing.
        origin: String,
        /// What is wrong and how to fix it.
        detail: String,
    },
}

impl ConfigError {
    /// Configuration errors never go away by retrying.
    pub fn is_retriable(&self) -> bool {
        false
    }
}
