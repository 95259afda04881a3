//! Where a fence flow stands: its states, their stored names, and which of them may have let
//! the workload go elsewhere.

/// Where a fence flow stands. Each state is committed before its action runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Read the release plan (and save the Node's metadata when it will be deleted).
    Plan,
    /// Send the fence (power off, confirmed by the gateway).
    PowerOff,
    /// Read the power state back; an "off" is the proof that opens the release.
    ConfirmOff,
    /// Release the workload (first pass).
    Release,
    /// Release passes until the node's pods and VolumeAttachments are gone.
    WaitReleased,
    /// Power the machine on.
    PowerOn,
    /// Wait for the agent to report healthy with a new boot id.
    WaitBack,
    /// Remove the taint / put the saved metadata back once the Node re-registered.
    Restore,
    /// The machine is dumping its kernel: release on the kdump proof (first pass).
    KdumpRelease,
    /// kdump release passes until the node's pods and VolumeAttachments are gone.
    KdumpWaitReleased,
    /// Wait for "dump done" or `kdump_timeout` before any power action.
    KdumpWait,
    /// Finished: released, powered on and restored (or failed, see [`Flow::failure`]).
    Done,
    /// Gave up; `detail` says why and where.
    Failed {
        /// What went wrong, with the BMC's or API server's words.
        detail: String,
    },
}

impl State {
    /// The name stored in SQLite and shown by the CLI.
    pub fn kind(&self) -> &'static str {
        match self {
            State::Plan => "plan",
            State::PowerOff => "power-off",
            State::ConfirmOff => "confirm-off",
            State::Release => "release",
            State::WaitReleased => "wait-released",
            State::PowerOn => "power-on",
            State::WaitBack => "wait-back",
            State::Restore => "restore",
            State::KdumpRelease => "kdump-release",
            State::KdumpWaitReleased => "kdump-wait-released",
            State::KdumpWait => "kdump-wait",
            State::Done => "done",
            State::Failed { .. } => "failed",
        }
    }

    /// The inverse of [`State::kind`]; `detail` is used for `failed`.
    pub fn parse(kind: &str, detail: &str) -> Option<Self> {
        Some(match kind {
            "plan" => State::Plan,
            "power-off" => State::PowerOff,
            "confirm-off" => State::ConfirmOff,
            "release" => State::Release,
            "wait-released" => State::WaitReleased,
            "power-on" => State::PowerOn,
            "wait-back" => State::WaitBack,
            "restore" => State::Restore,
            "kdump-release" => State::KdumpRelease,
            "kdump-wait-released" => State::KdumpWaitReleased,
            "kdump-wait" => State::KdumpWait,
            "done" => State::Done,
            "failed" => State::Failed {
                detail: detail.to_string(),
            },
            _ => return None,
        })
    }

    /// Every state a flow can be in before it ends, in the order a flow meets them (the
    /// kdump leg's between confirm-off's and power-on).
    pub fn running() -> [State; 11] {
        [
            State::Plan,
            State::PowerOff,
            State::ConfirmOff,
            State::Release,
            State::WaitReleased,
            State::KdumpWait,
            State::KdumpRelease,
            State::KdumpWaitReleased,
            State::PowerOn,
            State::WaitBack,
            State::Restore,
        ]
    }

    /// True for `Done` and `Failed`.
    pub fn is_terminal(&self) -> bool {
        matches!(self, State::Done | State::Failed { .. })
    }

    /// True for the states whose action may let the workload go elsewhere, or that follow
    /// such an action: once here, the machine must be powered on before giving up.
    pub fn released_or_after(&self) -> bool {
        matches!(
            self,
            State::Release
                | State::WaitReleased
                | State::PowerOn
                | State::WaitBack
                | State::Restore
                | State::KdumpRelease
                | State::KdumpWaitReleased
                | State::KdumpWait
        )
    }
}
