//! Admin API: diagnostics bundles that agents sent for repair entries
//! (`coordinatorctl diagnostics list|get ADDRESS`).

use serde::{Deserialize, Serialize};

/// A diagnostics request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiagnosticsRequest {
    /// The bundles kept for a machine, newest first, without their contents.
    List {
        /// The machine's address.
        address: String,
    },
    /// One bundle with its contents: the one with `id`, or the machine's newest.
    Get {
        /// The machine's address.
        address: String,
        /// The bundle's id; `None` = the newest.
        id: Option<u64>,
    },
}

/// The answer to a [`DiagnosticsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiagnosticsResponse {
    /// Answer to `List`.
    List(Vec<DiagnosticsSummary>),
    /// Answer to `Get`.
    Get(Box<DiagnosticsRecord>),
}

/// A stored bundle without its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosticsSummary {
    /// The bundle's id.
    pub id: u64,
    /// The machine's address.
    pub address: String,
    /// The repair entry it was collected for.
    pub entry_index: u64,
    /// When it was stored, milliseconds since the Unix epoch.
    pub collected_unix_ms: i64,
    /// Bytes of content.
    pub bytes: u64,
    /// Names of the parts that were cut to fit the agent's limit.
    pub truncated_parts: Vec<String>,
}

/// A stored bundle with its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosticsRecord {
    /// What it is.
    pub summary: DiagnosticsSummary,
    /// The bundle as text: a `===== part =====` header before each part.
    pub content: String,
}
