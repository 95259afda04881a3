//! Agent actions: the coordinator asks a node-agent, over the agent's own connection, for one
//! of a small fixed set of actions, and the agent answers how it went.
//!
//! ```text
//! coordinator                                   node-agent
//!   open_bi on the agent's connection ─────────▶ accept_bi
//!   ActionRequest { id, action }      ─────────▶ allowed? seen before?
//!                                     ◀───────── ActionReply { Accepted }   (or a final status)
//!                                     ◀───────── ActionReply { Done | Failed | Diagnostics }
//! ```
//!
//! Only the coordinator end of a connection the agent opened (and authenticated with mutual
//! TLS) can open such a stream: agents listen on no port, and the set of actions is a closed
//! enum, so no arbitrary command ever travels to a server. The agent repeats the answer it
//! gave for a request id it has seen instead of acting twice.
//!
//! `Reboot` ends differently: the agent answers `Accepted`, says goodbye with
//! [`crate::messages::GoodbyeReason::Reboot`] and closes the connection before the reboot;
//! the coordinator knows it is done when the agent returns with a new boot id.
//!
//! Version: these messages only travel on streams the coordinator opens, after both ends
//! spoke protocol version 1 or later; they were new types, not changes to existing ones. An
//! agent from before them never accepts such a stream and the coordinator's request times
//! out with a reason saying so. From version 2 ([`crate::fencing::FENCING_VERSION`]) the
//! request travels as a [`FencedActionRequest`] with the coordinator's fencing token; on a
//! version 1 connection (an agent or a coordinator of an older release) as before.

use serde::{Deserialize, Serialize};

/// Largest frame on an action stream: a diagnostics bundle (256 KiB by default, at most
/// [`MAX_DIAGNOSTICS_BYTES`]) plus its envelope. The ordinary 64 KiB report limit would
/// refuse it, and a larger limit everywhere would let any peer make the coordinator buffer
/// megabytes per report.
pub const MAX_ACTION_FRAME_LEN: usize = 1024 * 1024;

/// The most diagnostics an agent may be configured to send: leaves room under
/// [`MAX_ACTION_FRAME_LEN`] for part names, markers and the envelope.
pub const MAX_DIAGNOSTICS_BYTES: usize = 768 * 1024;

/// Longest request id: the coordinator's ids are about 60 bytes; the agent keeps ids it has
/// seen, so an id must not be a way to make it store megabytes.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Marker appended to a diagnostics part cut at its share of the size limit.
pub const TRUNCATED_MARKER: &str = "\n[… truncated by node-agent]\n";

/// One request, the only frame the coordinator writes on an action stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRequest {
    /// Unique per intended action; a resend (after a lost answer or a coordinator restart)
    /// carries the same id so the agent acts at most once.
    pub id: String,
    /// What to do.
    pub action: AgentAction,
}

/// An [`ActionRequest`] with the coordinator's fencing token: what a coordinator sends on a
/// connection whose hello spoke [`crate::fencing::FENCING_VERSION`] or later (the request's
/// encoding with the token after it); on a version 1 connection the request travels alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedActionRequest {
    /// The request.
    pub request: ActionRequest,
    /// Who asks, in which epoch: an agent that has seen a higher epoch of the same store
    /// refuses it ([`ActionFailure::OlderEpoch`]) before doing anything.
    pub token: crate::fencing::FencingToken,
}

/// The fixed set of actions an agent can be asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentAction {
    /// Restart a systemd unit the agent's configuration allows (e.g. `kubelet`).
    RestartUnit {
        /// The unit's name, as in the agent's `allowed_units`.
        unit: String,
    },
    /// Reboot the machine cleanly, after a goodbye with reason reboot.
    Reboot,
    /// Gather bounded diagnostics (journal, kernel log, failing checks, mounts, NIC counters).
    CollectDiagnostics,
}

impl AgentAction {
    /// The action's name as in repair steps (`restart-unit kubelet`, `reboot`, …).
    pub fn describe(&self) -> String {
        match self {
            AgentAction::RestartUnit { unit } => format!("restart-unit {unit}"),
            AgentAction::Reboot => "reboot".into(),
            AgentAction::CollectDiagnostics => "collect-diagnostics".into(),
        }
    }
}

/// One answer frame on an action stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionReply {
    /// The request's id.
    pub id: String,
    /// Where the action stands.
    pub status: ActionStatus,
}

/// Where an action stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionStatus {
    /// The agent took the request and is acting; a final status follows, except for
    /// `reboot`, whose end is the goodbye and a new boot id.
    Accepted,
    /// The action finished successfully.
    Done {
        /// What was done (command and exit status), for a person.
        detail: String,
    },
    /// The action was refused or failed.
    Failed {
        /// Why, as a category.
        code: ActionFailure,
        /// What happened and what to do.
        detail: String,
    },
    /// The diagnostics asked for.
    Diagnostics(DiagnosticsBundle),
}

/// How the detail of a [`ActionStatus::Failed`] begins when the agent stopped (was killed,
/// crashed or restarted) while it ran the request's command: whether the action took effect
/// is unknown, and the agent does not run the id again. The code stays
/// [`ActionFailure::Error`], which coordinators from before this marker read as a failure.
pub const OUTCOME_UNKNOWN: &str = "outcome unknown: ";

impl ActionStatus {
    /// True for a status after which nothing more is sent for the request.
    pub fn is_final(&self) -> bool {
        !matches!(self, ActionStatus::Accepted)
    }

    /// True for the answer to an id whose command the agent was running when it stopped
    /// ([`OUTCOME_UNKNOWN`]): acting again needs a new id.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, ActionStatus::Failed { detail, .. } if detail.starts_with(OUTCOME_UNKNOWN))
    }
}

/// Why an action did not happen or did not work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionFailure {
    /// The agent's configuration does not allow this action (or this unit).
    NotAllowed,
    /// The request itself is invalid (empty or oversized id, bad unit name).
    BadRequest,
    /// The command ran and failed.
    CommandFailed,
    /// The command did not finish within its time limit and was killed.
    TimedOut,
    /// The command could not be started, or the agent could not record the request.
    Error,
    /// The request's fencing token is older than one the agent has seen for the same store:
    /// a newer coordinator leads ([`crate::fencing::refusal`]). Only sent on connections of
    /// [`crate::fencing::FENCING_VERSION`] or later.
    OlderEpoch,
}

impl ActionFailure {
    /// Lower-case name for logs and summaries.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionFailure::NotAllowed => "not-allowed",
            ActionFailure::BadRequest => "bad-request",
            ActionFailure::CommandFailed => "command-failed",
            ActionFailure::TimedOut => "timed-out",
            ActionFailure::Error => "error",
            ActionFailure::OlderEpoch => "older-epoch",
        }
    }
}

/// Diagnostics as gathered by the agent: named parts, each cut to its share of the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosticsBundle {
    /// The parts, in the order gathered.
    pub parts: Vec<DiagnosticsPart>,
    /// The size limit the agent applied, in bytes of part contents.
    pub limit_bytes: u64,
}

impl DiagnosticsBundle {
    /// Total bytes of part contents.
    pub fn total_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.content.len()).sum()
    }

    /// The bundle as one text, a header line per part, for storing and printing.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(self.total_bytes() + 64 * self.parts.len());
        for p in &self.parts {
            out.push_str("===== ");
            out.push_str(&p.name);
            if p.truncated {
                out.push_str(" (truncated)");
            }
            out.push_str(" =====\n");
            out.push_str(&p.content);
            if !p.content.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }
}

/// One part of a [`DiagnosticsBundle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosticsPart {
    /// What this is, e.g. `journal kubelet`, `kernel log`, `mounts`.
    pub name: String,
    /// The text, ending in [`TRUNCATED_MARKER`] when cut.
    pub content: String,
    /// Whether the content was cut to fit.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_payload, encode_frame};

    #[test]
    fn request_and_replies_round_trip() {
        let req = ActionRequest {
            id: "db1-e3-r0-a0".into(),
            action: AgentAction::RestartUnit {
                unit: "kubelet".into(),
            },
        };
        let f = encode_frame(&req, MAX_ACTION_FRAME_LEN).unwrap();
        assert_eq!(decode_payload::<ActionRequest>(&f[4..]).unwrap(), req);
        let bundle = DiagnosticsBundle {
            parts: vec![DiagnosticsPart {
                name: "mounts".into(),
                content: "x".repeat(MAX_DIAGNOSTICS_BYTES),
                truncated: false,
            }],
            limit_bytes: MAX_DIAGNOSTICS_BYTES as u64,
        };
        let reply = ActionReply {
            id: req.id.clone(),
            status: ActionStatus::Diagnostics(bundle),
        };
        // The largest allowed bundle fits in one action frame.
        let f = encode_frame(&reply, MAX_ACTION_FRAME_LEN).unwrap();
        assert_eq!(decode_payload::<ActionReply>(&f[4..]).unwrap(), reply);
        assert!(reply.status.is_final());
        assert!(!ActionStatus::Accepted.is_final());
    }

    #[test]
    fn bundle_renders_headers_and_truncation() {
        let b = DiagnosticsBundle {
            parts: vec![
                DiagnosticsPart {
                    name: "kernel log".into(),
                    content: "a".into(),
                    truncated: true,
                },
                DiagnosticsPart {
                    name: "mounts".into(),
                    content: "b\n".into(),
                    truncated: false,
                },
            ],
            limit_bytes: 10,
        };
        assert_eq!(
            b.render(),
            "===== kernel log (truncated) =====\na\n===== mounts =====\nb\n"
        );
        assert_eq!(b.total_bytes(), 3);
    }
}
