//! The form the agent's messages are sent in: this release's, or one an older coordinator
//! reads. The agent falls back a form when the coordinator refuses a report as malformed
//! (`Agent` decides when); this module only shapes a message for the form chosen.

use protocol::messages::AgentMessage;

/// The form reports are sent in: this release's, or one an older coordinator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReportForm {
    /// Everything this release sends.
    Full,
    /// Without plugin, gpu and memory results (`HealthReport::without_newer_kinds`).
    WithoutNewerKinds,
    /// Without those and without the report interval ([`protocol::messages::v1`]).
    V1,
}

/// A message shaped for a [`ReportForm`], ready to write.
pub(super) enum Shaped {
    /// This release's message type (the full form, or without the newer check kinds).
    Current(AgentMessage),
    /// The first release's message type.
    V1(protocol::messages::v1::AgentMessage),
}

impl ReportForm {
    /// `msg` in this form: a report loses what the form leaves out; other messages are kept.
    pub(super) fn shape(self, msg: AgentMessage) -> Shaped {
        let trimmed = |msg| match msg {
            AgentMessage::Report(r) => AgentMessage::Report(r.without_newer_kinds()),
            other => other,
        };
        match self {
            ReportForm::Full => Shaped::Current(msg),
            ReportForm::WithoutNewerKinds => Shaped::Current(trimmed(msg)),
            ReportForm::V1 => Shaped::V1(protocol::messages::v1::AgentMessage::from(trimmed(msg))),
        }
    }
}
