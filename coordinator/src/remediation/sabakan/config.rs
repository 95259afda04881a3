//! `[remediation.auto_repair.sabakan]` and `source`: where auto-repair's machines come from,
//! and how to reach a sabakan.
//!
//! This module parses only; the checks that span `[remediation.auto_repair]` are
//! [`super::validate`], and the poller is [`super::SabakanSource`].

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::duration;

/// Long enough for a sabakan answering a fleet's worth of machines from etcd; short enough
/// that a dead one is noticed within a pass or two.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where auto-repair's machines come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The coordinator's own registry (inventory and agents).
    #[default]
    Inventory,
    /// A sabakan's GraphQL API (`[remediation.auto_repair.sabakan]`).
    Sabakan,
}

/// `[remediation.auto_repair.sabakan]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SabakanConfig {
    /// The GraphQL endpoint, e.g. `http://sabakan.example:10080/graphql`.
    pub url: String,
    /// Timeout of one request (connect, send, whole answer).
    #[serde(with = "duration", default = "default_timeout")]
    pub timeout: Duration,
    /// PEM roots for an `https` URL (sabakan usually runs with a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}
