//! Messages every connection starts with, and the agent ↔ coordinator conversation.
//!
//! Every connection opens a bidirectional stream whose first frame is a [`ClientHello`]; the
//! server answers with a [`HelloReply`]. Under TLS 1.3 a server's rejection of a client
//! certificate only surfaces at the client's first read, so this exchange is also how a client
//! learns whether it was let in at all.
//!
//! After an accepted agent hello, the agent sends [`AgentMessage`]s on the same stream and the
//! coordinator answers each with a [`CoordinatorReply`].
//!
//! These types are encoded with postcard, which is not self-describing: variants may only be
//! appended, never reordered, and no `#[serde(flatten)]`, `untagged` or `skip_serializing_if`
//! may be used on them. Their serde names are used for JSON output by the CLIs.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::gateway::CoordinatorHello;

/// First message on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientHello {
    /// The client's [`crate::PROTOCOL_VERSION`]. Encoded first so it can be read with
    /// [`peek_version`] even when the rest of the message is from an unknown version.
    pub protocol_version: u16,
    /// What kind of client this is, with its role-specific introduction.
    pub body: HelloBody,
}

/// Role-specific part of a [`ClientHello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloBody {
    /// A node-agent introducing the server it runs on.
    Agent(AgentHello),
    /// An admin client (coordinatorctl).
    Admin(AdminHello),
    /// A coordinator connecting to a bmc-gateway.
    Coordinator(CoordinatorHello),
    /// `node-agent kdump-notify` in a node's kdump initramfs: the notice is the whole
    /// request, an accepted [`HelloReply`] says it was recorded, and the connection ends.
    Kdump(KdumpNotice),
}

/// Reads only the protocol version from the start of a hello payload.
pub fn peek_version(payload: &[u8]) -> Result<u16, crate::FrameError> {
    let (v, _) = postcard::take_from_bytes::<u16>(payload)?;
    Ok(v)
}

/// What a node-agent says about its server when it connects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHello {
    /// The server's hostname; must equal the name in the agent's certificate.
    pub hostname: String,
    /// Serial number from DMI (`/sys/class/dmi/id/product_serial`), empty if unreadable.
    pub serial: String,
    /// The server's non-loopback addresses.
    pub addresses: Vec<IpAddr>,
    /// node-agent's version.
    pub agent_version: String,
    /// `/proc/sys/kernel/random/boot_id`: changes on every boot.
    pub boot_id: String,
}

/// A crash dump's progress, sent from the kdump initramfs with the node's own certificate.
///
/// The kdump kernel has its own boot id and no agent configuration, so this is not an
/// agent hello: it never makes the machine look alive, and it carries only what the
/// initramfs knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdumpNotice {
    /// The node's hostname; must equal the name in its certificate.
    pub hostname: String,
    /// Dump started or finished.
    pub phase: KdumpPhase,
    /// The boot id of the kernel that crashed, if the initramfs was told it.
    pub boot_id: Option<String>,
    /// When the phase was reached, milliseconds since the Unix epoch, by the node's clock
    /// (the coordinator records its own receive time too: a kdump kernel's clock may be off).
    pub time_unix_ms: u64,
}

/// The phase a [`KdumpNotice`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KdumpPhase {
    /// The kdump kernel booted and is writing the dump: the machine runs no workload.
    Start,
    /// The dump is written; the machine reboots or powers off next.
    Done,
}

impl KdumpPhase {
    /// Lower-case name (`start`, `done`), as on the `kdump-notify --phase` command line.
    pub fn as_str(self) -> &'static str {
        match self {
            KdumpPhase::Start => "start",
            KdumpPhase::Done => "done",
        }
    }
}

impl std::str::FromStr for KdumpPhase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "start" => Ok(KdumpPhase::Start),
            "done" => Ok(KdumpPhase::Done),
            other => Err(format!("unknown kdump phase {other:?}: use start or done")),
        }
    }
}

/// What an admin client says when it connects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminHello {
    /// Client program and version, for logs.
    pub client: String,
}

/// The server's answer to a [`ClientHello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// The connection may proceed.
    Accepted {
        /// The server's protocol version.
        protocol_version: u16,
        /// The server's name, for logs.
        server: String,
    },
    /// The connection is refused; the server closes it after this.
    Refused(Refusal),
}

/// A refusal with a machine-readable code and a reason for a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("refused ({code:?}): {reason}")]
pub struct Refusal {
    /// Category.
    pub code: RefusalCode,
    /// What was wrong and what to do.
    pub reason: String,
}

impl Refusal {
    /// Builds a refusal.
    pub fn new(code: RefusalCode, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
        }
    }
}

/// Why something was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalCode {
    /// The peer speaks another protocol version.
    UnsupportedVersion,
    /// The peer's certificate role may not do this (e.g. a node calling the admin API).
    NotAuthorized,
    /// The peer claims to be someone its certificate does not name.
    IdentityMismatch,
    /// A frame could not be decoded.
    Malformed,
    /// A frame exceeded the size limit.
    FrameTooLarge,
    /// The server is shutting down.
    ShuttingDown,
    /// Something failed on the server; the reason says what.
    Internal,
    /// The request was understood but is invalid (bad address, unknown entry, …).
    BadRequest,
}

/// What an agent sends after its hello was accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// A periodic health report.
    Report(HealthReport),
    /// The agent is stopping on purpose; the machine is not failing.
    Goodbye(Goodbye),
}

/// One round of health checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    /// Increases by one per report within one agent process.
    pub seq: u64,
    /// When the checks ran, milliseconds since the Unix epoch, by the agent's clock.
    pub time_unix_ms: u64,
    /// The boot id at the time of the report.
    pub boot_id: String,
    /// One result per check and subject.
    pub checks: Vec<CheckResult>,
}

impl HealthReport {
    /// True when no check failed. `warn` and `unknown` do not make a machine unhealthy.
    pub fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != CheckStatus::Fail)
    }

    /// The checks that failed.
    pub fn failing(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| c.status == CheckStatus::Fail)
    }
}

/// Result of one check on one subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Which check.
    pub kind: CheckKind,
    /// What was checked: `kubelet`, an interface such as `eth0`, a mount such as `/var`, `kdump`.
    pub subject: String,
    /// Outcome.
    pub status: CheckStatus,
    /// What was seen, for a person.
    pub detail: String,
}

/// The kinds of checks an agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// kubelet's healthz endpoint.
    Kubelet,
    /// A required network interface.
    Nic,
    /// A required filesystem.
    Disk,
    /// Crash kernel readiness.
    Kdump,
}

impl CheckKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::Kubelet => "kubelet",
            CheckKind::Nic => "nic",
            CheckKind::Disk => "disk",
            CheckKind::Kdump => "kdump",
        }
    }
}

/// Outcome of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// Healthy.
    Ok,
    /// Degraded but not failing (e.g. space getting low, link flapped).
    Warn,
    /// Failing: the machine is unhealthy.
    Fail,
    /// Could not be determined.
    Unknown,
}

impl CheckStatus {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Ok => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
            CheckStatus::Unknown => "unknown",
        }
    }
}

/// An agent's last words before a planned stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Goodbye {
    /// Why the agent stops.
    pub reason: GoodbyeReason,
}

/// Why an agent says goodbye.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GoodbyeReason {
    /// The system is shutting down or rebooting on purpose.
    Shutdown,
    /// Only the agent restarts (upgrade, config change).
    Restart,
    /// The coordinator asked for a clean reboot ([`crate::actions::AgentAction::Reboot`]);
    /// the agent comes back with a new boot id.
    Reboot,
}

/// The coordinator's answer to each [`AgentMessage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinatorReply {
    /// Report or goodbye recorded.
    Ack {
        /// Sequence number of the acknowledged report (0 for a goodbye).
        seq: u64,
    },
    /// The message was refused; the coordinator closes the connection.
    Refused(Refusal),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{MAX_FRAME_LEN, decode_payload, encode_frame};

    #[test]
    fn version_can_be_peeked_from_any_hello() {
        let hello = ClientHello {
            protocol_version: 4242,
            body: HelloBody::Admin(AdminHello {
                client: "test".into(),
            }),
        };
        let frame = encode_frame(&hello, MAX_FRAME_LEN).unwrap();
        assert_eq!(peek_version(&frame[4..]).unwrap(), 4242);
        let back: ClientHello = decode_payload(&frame[4..]).unwrap();
        assert_eq!(back, hello);
    }

    #[test]
    fn a_kdump_notice_is_a_hello_that_round_trips_and_peeks() {
        let hello = ClientHello {
            protocol_version: crate::PROTOCOL_VERSION,
            body: HelloBody::Kdump(KdumpNotice {
                hostname: "node-1".into(),
                phase: KdumpPhase::Start,
                boot_id: Some("b1".into()),
                time_unix_ms: 1_800_000_000_000,
            }),
        };
        let frame = encode_frame(&hello, MAX_FRAME_LEN).unwrap();
        assert_eq!(peek_version(&frame[4..]).unwrap(), crate::PROTOCOL_VERSION);
        assert_eq!(decode_payload::<ClientHello>(&frame[4..]).unwrap(), hello);
        assert_eq!("done".parse::<KdumpPhase>(), Ok(KdumpPhase::Done));
        assert!(
            "dumping"
                .parse::<KdumpPhase>()
                .unwrap_err()
                .contains("start or done")
        );
    }

    #[test]
    fn check_names_serialise_lowercase_for_json() {
        let c = CheckResult {
            kind: CheckKind::Nic,
            subject: "eth0".into(),
            status: CheckStatus::Fail,
            detail: String::new(),
        };
        let js = serde_json::to_string(&c).unwrap();
        assert!(js.contains("\"nic\"") && js.contains("\"fail\""), "{js}");
    }
}
