//! What every command run shares: the context it runs in ([`RunContext`]), how it ended
//! ([`Outcome`]), and the agent health `@agent-healthy` reads ([`AgentHealthView`]).
//!
//! Kept apart from [`super::command`], which runs commands and dispatches the built-ins to
//! [`super::agent_steps`] and [`super::power_steps`]: those read these types, so the three
//! files import this one and not each other in a circle.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use super::diagnostics::DiagnosticsShelf;
use super::fencing::FenceService;
use super::orphans::GroupLedger;
use crate::agent_link::AgentActions;
use crate::gateway::PowerControl;

/// Bytes kept of each of stdout and stderr. Enough for a BMC tool's error message; a chatty
/// command must not bloat the history table of a 10,000-entry queue.
pub const OUTPUT_LIMIT: usize = 4096;

/// What the coordinator knows about a machine's agent, for `@agent-healthy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHealth {
    /// The boot id of the last report.
    pub boot_id: String,
    /// When the last report was received (coordinator clock).
    pub last_report: Timestamp,
    /// Start of the current run of reports with every check ok; `None` when the last report
    /// had a failing check.
    pub ok_since: Option<Timestamp>,
}

/// Why there is no [`AgentHealth`] for a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReport {
    /// Its agent has never reported (the machine is uninitialized, awaiting registration,
    /// or not in the inventory).
    Never,
    /// None since the coordinator started at this time. Reports are kept in memory only,
    /// so one that came before, perhaps for hours, is not known any more.
    SinceStart(Timestamp),
}

/// The foundation's live-health view, as the repair queue needs it. Implemented by the
/// health module; faked in tests.
pub trait AgentHealthView: Send + Sync + 'static {
    /// The agent's state for the machine at `address`, `None` if it has not reported since
    /// the coordinator started ([`AgentHealthView::no_report`] says whether it ever did).
    fn agent_health(&self, address: &str) -> Option<AgentHealth>;

    /// The boot id the machine's agent last reported, also from before a coordinator
    /// restart when the agent has not reported since: the boot a power step must see
    /// replaced. Default: the live one.
    fn boot_id(&self, address: &str) -> Option<String> {
        self.agent_health(address).map(|h| h.boot_id)
    }

    /// Why [`AgentHealthView::agent_health`] has nothing for `address`. Default: never
    /// reported.
    fn no_report(&self, address: &str) -> NoReport {
        let _ = address;
        NoReport::Never
    }

    /// True when the machine's agent is known silent past its grace (state `unreachable`):
    /// nothing is asked of it before a fence. Default: not known.
    fn is_unreachable(&self, address: &str) -> bool {
        let _ = address;
        false
    }
}

/// A view with no agents: `@agent-healthy` never passes.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAgents;

impl AgentHealthView for NoAgents {
    fn agent_health(&self, _address: &str) -> Option<AgentHealth> {
        None
    }
}

/// What a command is for: a health check passes only if its stdout says `true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommandKind {
    /// A step's repair command.
    Repair,
    /// The operation's health check.
    Health,
    /// The operation's success command.
    Success,
}

impl CommandKind {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Repair => "repair",
            CommandKind::Health => "health",
            CommandKind::Success => "success",
        }
    }
}

/// How a command ended, beyond ok/failed, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Succeeded (a health check that passed).
    Ok,
    /// Ran and failed (non-zero exit, health check not `true`, power action failed).
    Failed,
    /// Killed at its time limit.
    Timeout,
    /// Could not be run at all (program missing, gateway not available).
    Error,
}

impl Outcome {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// Everything a command run needs besides the spec.
#[derive(Clone)]
pub struct RunContext {
    /// The machine's address (appended to external commands).
    pub address: String,
    /// The machine's serial (checked by the gateway).
    pub serial: String,
    /// Power request id: the same id for a re-run after a restart, so the gateway executes
    /// it at most once.
    pub request_id: String,
    /// Time limit; `None` = no limit.
    pub timeout: Option<Duration>,
    /// When the step began (`@agent-healthy` wants reports after it).
    pub step_began: Timestamp,
    /// Boot id before a power step (`@agent-healthy` wants a different one); empty = any.
    pub boot_id_before: String,
    /// Power control.
    pub power: Arc<dyn PowerControl>,
    /// Agent health.
    pub agents: Arc<dyn AgentHealthView>,
    /// Where an external command's process group is recorded; `None` = not recorded.
    pub groups: Option<GroupLedger>,
    /// Agent actions (`@restart-unit`, `@reboot`, `@collect-diagnostics`).
    pub actions: Arc<dyn AgentActions>,
    /// Where `@collect-diagnostics` keeps what it got; `None` = nowhere (the step fails).
    pub diagnostics: Option<DiagnosticsShelf>,
    /// The entry's index (the key of the fence flow a step starts).
    pub entry_index: u64,
    /// Fence flows for `@fence`; `None` = no cluster to release from (see
    /// [`super::power_steps::fence_without_release`]).
    pub fence: Option<Arc<FenceService>>,
    /// `[fence] keep_off` for an `@fence` with nothing to release; `None` = keep off.
    pub keep_off: Option<super::fencing::KeepOffOf>,
    /// `[fence]` `off_timeout`/`on_timeout` for an `@fence` with nothing to release; `None`
    /// = the step's limit alone.
    pub fence_timeouts: Option<super::fencing::FenceTimeoutsOf>,
    /// Crash dumps: an `@fence` with nothing to release waits for a dumping machine's dump
    /// (see [`super::power_steps`]); `None` = no dump is ever known.
    pub kdump: Option<Arc<dyn crate::fence::kdump::KdumpView>>,
}
