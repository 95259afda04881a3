//! `[kubernetes]` in the coordinator configuration: which cluster to drain through, how a
//! fenced node's workload is released, and the client's refresh and request limits.
//!
//! This module parses only; [`super::client`] builds the client from it.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a fenced node's workload is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseMethod {
    /// Out-of-service taint where the cluster supports it (1.28+), Node deletion otherwise.
    #[default]
    Auto,
    /// Always the `node.kubernetes.io/out-of-service` taint.
    Taint,
    /// Always save labels and annotations and delete the Node object.
    DeleteNode,
}

/// The `kubernetes` section of the coordinator configuration. Absent: no cluster, no
/// machine is a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct KubernetesConfig {
    /// Path of a kubeconfig file. Unset: `KUBECONFIG`, `~/.kube/config`, then the in-cluster
    /// service account.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// Context to use from the kubeconfig. Unset: its current context.
    #[serde(default)]
    pub context: Option<String>,
    /// How fenced nodes are released.
    #[serde(default)]
    pub release_method: ReleaseMethod,
    /// Time between refreshes of the node view detectors read (`"10s"`).
    #[serde(
        default = "default_node_view_refresh",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub node_view_refresh: Duration,
    /// Per-request timeout (`"30s"`).
    #[serde(
        default = "default_request_timeout",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub request_timeout: Duration,
    /// Name reported as the Event source (`reportingInstance`).
    #[serde(default)]
    pub instance: Option<String>,
}

fn default_node_view_refresh() -> Duration {
    // Detectors act on minutes-scale conditions (node-startup timeouts, unhealthy
    // conditions for N seconds); 10 s keeps the view fresh without loading the API server
    // with full Node lists from every coordinator.
    Duration::from_secs(10)
}

fn default_request_timeout() -> Duration {
    // Long enough for a slow API server under load, short enough that a hung connection
    // surfaces as "unavailable" well inside an eviction timeout.
    Duration::from_secs(30)
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            release_method: ReleaseMethod::Auto,
            node_view_refresh: default_node_view_refresh(),
            request_timeout: default_request_timeout(),
            instance: None,
        }
    }
}
