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
//!
//! A field added to an agent's message after the first release keeps the older encoding
//! readable: [`v1`] holds the agent messages as agents before
//! [`HealthReport::report_interval_ms`] encode them, [`decode_agent_message`] reads either,
//! and an agent talking to a coordinator from before the field writes the [`v1`] form.
//!
//! [`CheckKind`] grew the same way: `plugin`, `gpu` and `memory` were appended after the
//! first four. A coordinator of this release reads every older agent's reports unchanged (a
//! variant's index never moves); an older coordinator refuses a report holding a newer kind
//! as malformed, and the agent then sends [`HealthReport::without_newer_kinds`] (in the
//! [`v1`] form too if that is refused as well).

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest report interval an agent may use, and the longest a coordinator takes from a
/// report. A coordinator judges a machine silent after three of its agent's intervals; at one
/// minute that is three minutes, still well under the ten minutes (`goodbye_grace`) a
/// machine that said goodbye may be away, and a dead machine is noticed within minutes, not
/// hours. Longer intervals are refused by the agent's configuration.
pub const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(60);

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
    /// The server is a coordinator that does not lead now (a standby): the client goes to
    /// the leader, or to its next coordinator address. Sent only to clients whose hello
    /// spoke version 2 or later (older ones get a `shutting-down` refusal with the same
    /// words); the server closes the connection after this.
    Standby {
        /// The leading coordinator's QUIC address (`host:port`), when this one knows it.
        leader: Option<String>,
        /// For a person: `standby; the leader is …`.
        reason: String,
    },
}

/// The words of a [`HelloReply::Standby`] for `leader`.
pub fn standby_reason(leader: Option<&str>) -> String {
    match leader {
        Some(l) => format!("standby; the leader is {l}"),
        None => "standby; no leader is known now: try another coordinator".to_string(),
    }
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
    /// The agent's report interval when it sent this report, in milliseconds: its next
    /// report is due within it. The coordinator judges the machine's silence on it (see
    /// [`HealthReport::report_interval`]). 0 when the agent did not say: an agent from before
    /// this field, or one talking to a coordinator from before it (see [`v1`]).
    pub report_interval_ms: u64,
}

impl HealthReport {
    /// The report interval the agent announced, at most [`MAX_REPORT_INTERVAL`]; `None` when
    /// it did not say.
    pub fn report_interval(&self) -> Option<Duration> {
        (self.report_interval_ms > 0)
            .then(|| Duration::from_millis(self.report_interval_ms).min(MAX_REPORT_INTERVAL))
    }

    /// True when no check failed. `warn` and `unknown` do not make a machine unhealthy.
    pub fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != CheckStatus::Fail)
    }

    /// The checks that failed.
    pub fn failing(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| c.status == CheckStatus::Fail)
    }

    /// Whether a check of a kind newer than the first four (plugin, gpu, memory) is in it.
    pub fn has_newer_kinds(&self) -> bool {
        self.checks
            .iter()
            .any(|c| !c.kind.known_to_every_coordinator())
    }

    /// The report without the checks of kinds newer than the first four: what a
    /// coordinator from before them can read. Their results are lost to it, which is why the
    /// agent says so in its log.
    pub fn without_newer_kinds(mut self) -> Self {
        self.checks.retain(|c| c.kind.known_to_every_coordinator());
        self
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
    /// A plugin check of the agent's configuration (node-problem-detector's custom plugin
    /// contract); the subject is the check's name.
    Plugin,
    /// NVIDIA GPU Xid errors from the kernel log; the subject is the GPU's PCI address.
    Gpu,
    /// Memory ECC counters (EDAC); the subject is the memory controller (`mc0`).
    Memory,
}

impl CheckKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::Kubelet => "kubelet",
            CheckKind::Nic => "nic",
            CheckKind::Disk => "disk",
            CheckKind::Kdump => "kdump",
            CheckKind::Plugin => "plugin",
            CheckKind::Gpu => "gpu",
            CheckKind::Memory => "memory",
        }
    }

    /// True for the kinds every coordinator reads (kubelet, NIC, disk, kdump). A coordinator
    /// from before the others refuses a report holding one of them as malformed, so an
    /// agent talking to one leaves them out (see [`HealthReport::without_newer_kinds`]).
    pub fn known_to_every_coordinator(self) -> bool {
        matches!(
            self,
            CheckKind::Kubelet | CheckKind::Nic | CheckKind::Disk | CheckKind::Kdump
        )
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

/// Reads an agent's message, as this release encodes it or as agents before
/// [`HealthReport::report_interval_ms`] do ([`v1`]; read with no interval). The two cannot be
/// mistaken for each other: a report of this release is a [`v1`] report with more bytes after
/// it, which [`crate::decode_payload`] refuses, and a goodbye is the same in both.
pub fn decode_agent_message(payload: &[u8]) -> Result<AgentMessage, crate::FrameError> {
    crate::decode_payload::<AgentMessage>(payload).or_else(|e| {
        crate::decode_payload::<v1::AgentMessage>(payload)
            .map(AgentMessage::from)
            .map_err(|_| e)
    })
}

/// The agent messages of agents before [`HealthReport::report_interval_ms`], byte for byte
/// (postcard writes a variant as its index and a struct as its fields in order): what such
/// agents send, and what an agent sends to a coordinator from before the field, which
/// refuses a report carrying it as malformed.
pub mod v1 {
    use serde::{Deserialize, Serialize};

    use super::{CheckResult, Goodbye};

    /// [`super::AgentMessage`] before report intervals.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum AgentMessage {
        /// A periodic health report.
        Report(HealthReport),
        /// The agent is stopping on purpose.
        Goodbye(Goodbye),
    }

    /// [`super::HealthReport`] without the report interval.
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

    impl From<super::AgentMessage> for AgentMessage {
        fn from(m: super::AgentMessage) -> Self {
            match m {
                super::AgentMessage::Report(r) => AgentMessage::Report(HealthReport {
                    seq: r.seq,
                    time_unix_ms: r.time_unix_ms,
                    boot_id: r.boot_id,
                    checks: r.checks,
                }),
                super::AgentMessage::Goodbye(g) => AgentMessage::Goodbye(g),
            }
        }
    }

    impl From<AgentMessage> for super::AgentMessage {
        fn from(m: AgentMessage) -> Self {
            match m {
                AgentMessage::Report(r) => super::AgentMessage::Report(super::HealthReport {
                    seq: r.seq,
                    time_unix_ms: r.time_unix_ms,
                    boot_id: r.boot_id,
                    checks: r.checks,
                    report_interval_ms: 0,
                }),
                AgentMessage::Goodbye(g) => super::AgentMessage::Goodbye(g),
            }
        }
    }
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

    fn report(report_interval_ms: u64) -> HealthReport {
        HealthReport {
            seq: 3,
            time_unix_ms: 1_800_000_000_000,
            boot_id: "b1".into(),
            checks: vec![CheckResult {
                kind: CheckKind::Disk,
                subject: "/var".into(),
                status: CheckStatus::Ok,
                detail: String::new(),
            }],
            report_interval_ms,
        }
    }

    #[test]
    fn a_report_carries_its_interval_and_reports_of_agents_before_it_are_read() {
        let with = AgentMessage::Report(report(30_000));
        let frame = encode_frame(&with, MAX_FRAME_LEN).unwrap();
        let back = decode_agent_message(&frame[4..]).unwrap();
        assert_eq!(back, with);
        let AgentMessage::Report(r) = back else {
            unreachable!()
        };
        assert_eq!(r.report_interval(), Some(Duration::from_secs(30)));
        // What a coordinator before the field does with it: refuse it as malformed.
        assert!(decode_payload::<v1::AgentMessage>(&frame[4..]).is_err());

        // An agent from before the field (or one talking to such a coordinator): read, with
        // no interval, and readable by such a coordinator.
        let old = v1::AgentMessage::from(with.clone());
        let frame = encode_frame(&old, MAX_FRAME_LEN).unwrap();
        assert_eq!(
            decode_agent_message(&frame[4..]).unwrap(),
            AgentMessage::Report(report(0))
        );
        assert_eq!(
            decode_payload::<v1::AgentMessage>(&frame[4..]).unwrap(),
            old
        );
        assert_eq!(report(0).report_interval(), None);
        // A goodbye is the same in both.
        let bye = AgentMessage::Goodbye(Goodbye {
            reason: GoodbyeReason::Restart,
        });
        assert_eq!(
            encode_frame(&bye, MAX_FRAME_LEN).unwrap(),
            encode_frame(&v1::AgentMessage::from(bye.clone()), MAX_FRAME_LEN).unwrap()
        );
        // A frame that is neither says why the new form failed.
        assert!(decode_agent_message(&[0, 1]).is_err());
    }

    #[test]
    fn an_announced_interval_is_taken_up_to_the_maximum() {
        assert_eq!(
            report(3_600_000).report_interval(),
            Some(MAX_REPORT_INTERVAL)
        );
        let js = serde_json::to_string(&report(2_000)).unwrap();
        assert!(js.contains("\"report_interval_ms\":2000"), "{js}");
        let back: HealthReport = serde_json::from_str(&js).unwrap();
        assert_eq!(back, report(2_000));
    }

    #[test]
    fn newer_check_kinds_are_read_here_refused_by_older_coordinators_and_can_be_left_out() {
        let mut r = report(5_000);
        r.checks.push(CheckResult {
            kind: CheckKind::Gpu,
            subject: "0000:3b:00".into(),
            status: CheckStatus::Fail,
            detail: "Xid 79".into(),
        });
        assert!(r.has_newer_kinds());
        let msg = AgentMessage::Report(r.clone());
        let frame = encode_frame(&msg, MAX_FRAME_LEN).unwrap();
        assert_eq!(decode_agent_message(&frame[4..]).unwrap(), msg);
        // What a coordinator before the newer kinds knows: the first four variants only.
        #[derive(Debug, Deserialize)]
        enum OldKind {
            Kubelet,
            Nic,
            Disk,
            Kdump,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct OldCheck {
            kind: OldKind,
            subject: String,
            status: CheckStatus,
            detail: String,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct OldReport {
            seq: u64,
            time_unix_ms: u64,
            boot_id: String,
            checks: Vec<OldCheck>,
            report_interval_ms: u64,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        enum OldMessage {
            Report(OldReport),
            Goodbye(Goodbye),
        }
        assert!(decode_payload::<OldMessage>(&frame[4..]).is_err());
        let old = AgentMessage::Report(r.without_newer_kinds());
        let frame = encode_frame(&old, MAX_FRAME_LEN).unwrap();
        let back = decode_payload::<OldMessage>(&frame[4..]).unwrap();
        let OldMessage::Report(back) = back else {
            unreachable!()
        };
        assert_eq!(back.checks.len(), 1);
        assert!(matches!(back.checks[0].kind, OldKind::Disk));
        // And in the form before report intervals.
        let v1 = v1::AgentMessage::from(old.clone());
        let frame = encode_frame(&v1, MAX_FRAME_LEN).unwrap();
        assert_eq!(
            decode_agent_message(&frame[4..]).unwrap(),
            AgentMessage::Report(HealthReport {
                report_interval_ms: 0,
                ..report(5_000)
            })
        );
        assert_eq!(CheckKind::Memory.as_str(), "memory");
        let js = serde_json::to_string(&CheckKind::Plugin).unwrap();
        assert_eq!(js, "\"plugin\"");
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
