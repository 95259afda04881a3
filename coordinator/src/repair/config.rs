//! The `repair:` section as the coordinator holds it: CKE's keys and defaults as types,
//! the lookup of an entry's operation, and the drain options it implies.
//!
//! Built-in actions are spelled with a leading `@`, which no program on `PATH` can be named
//! in practice: `@power-cycle`, `@power-off`, `@power-on` and `@fence` (through the BMC
//! gateway) in `repair_command` and `success_command`; `@agent-healthy` in
//! `health_check_command`; `@restart-unit NAME`, `@reboot` and `@collect-diagnostics` (asked
//! of the machine's agent over its own connection, see [`crate::agent_link`]) in
//! `repair_command`.
//!
//! Reading and validating YAML is [`super::load`]'s job; this module neither reads files
//! nor runs anything.

use crate::k8s::DrainOptions;
pub use crate::k8s::selector::LabelSelector;

/// CKE's default for `command_timeout_seconds` (steps and health checks) and
/// `success_command_timeout`.
pub const DEFAULT_COMMAND_TIMEOUT_SECONDS: u64 = 30;
/// CKE's default for `eviction_timeout_seconds`: ten minutes.
pub const DEFAULT_EVICTION_TIMEOUT_SECONDS: u64 = 600;
/// CKE's default for `max_concurrent_repairs`.
pub const DEFAULT_MAX_CONCURRENT_REPAIRS: u32 = 1;

/// A built-in action, named with a leading `@` in place of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// `@power-cycle`: power cycle through the BMC gateway.
    PowerCycle,
    /// `@power-off`: hard power off.
    PowerOff,
    /// `@power-on`: power on.
    PowerOn,
    /// `@fence`: power off and confirm off by reading the power state.
    Fence,
    /// `@agent-healthy`: a health check that passes when the machine's agent has reported
    /// every check ok since the step began (and, after a power step, from a new boot).
    AgentHealthy,
}

impl Builtin {
    /// The spelling in configuration.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::PowerCycle => "@power-cycle",
            Builtin::PowerOff => "@power-off",
            Builtin::PowerOn => "@power-on",
            Builtin::Fence => "@fence",
            Builtin::AgentHealthy => "@agent-healthy",
        }
    }

    /// The built-in named `s` (with its `@`), if any.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Builtin::PowerCycle,
            Builtin::PowerOff,
            Builtin::PowerOn,
            Builtin::Fence,
            Builtin::AgentHealthy,
        ]
        .into_iter()
        .find(|b| b.name() == s)
    }

    /// True for the actions that go through the BMC gateway.
    pub fn is_power(self) -> bool {
        !matches!(self, Builtin::AgentHealthy)
    }
}

/// A command: an external program (the machine's address is appended as its last argument)
/// or a built-in action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandSpec {
    /// Program and arguments.
    External(Vec<String>),
    /// A built-in action.
    Builtin(Builtin),
    /// An action asked of the machine's node-agent.
    Agent(AgentStep),
}

/// A repair step carried out by the machine's node-agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentStep {
    /// `@restart-unit NAME`: restart a unit the agent allows; done when the restart command
    /// succeeded.
    RestartUnit(String),
    /// `@reboot`: a clean reboot; done when the agent returns with a new boot id.
    Reboot,
    /// `@collect-diagnostics`: diagnostics kept with the entry.
    CollectDiagnostics,
}

impl AgentStep {
    /// The built-in names of agent steps, for messages.
    pub const NAMES: &'static str = "@restart-unit NAME, @reboot, @collect-diagnostics";

    /// Parses an agent step from its argv (`["@restart-unit", "kubelet"]`); `None` if the
    /// first word is not an agent step, `Some(Err)` if its arguments are wrong.
    pub fn parse(argv: &[String]) -> Option<Result<Self, String>> {
        let args = &argv[1..];
        let no_args = |s: AgentStep| {
            if args.is_empty() {
                Ok(s)
            } else {
                Err(format!("`{}` takes no arguments", argv[0]))
            }
        };
        Some(match argv[0].as_str() {
            "@restart-unit" => match args {
                [unit] if valid_unit(unit) => Ok(AgentStep::RestartUnit(unit.clone())),
                [unit] => Err(format!("{unit:?} is not a unit name")),
                _ => Err("`@restart-unit` takes exactly one unit name, e.g. kubelet".into()),
            },
            "@reboot" => no_args(AgentStep::Reboot),
            "@collect-diagnostics" => no_args(AgentStep::CollectDiagnostics),
            _ => return None,
        })
    }

    /// The agent action this step asks for.
    pub fn action(&self) -> protocol::actions::AgentAction {
        use protocol::actions::AgentAction;
        match self {
            AgentStep::RestartUnit(u) => AgentAction::RestartUnit { unit: u.clone() },
            AgentStep::Reboot => AgentAction::Reboot,
            AgentStep::CollectDiagnostics => AgentAction::CollectDiagnostics,
        }
    }
}

/// Letters, digits and `-_.@:`, not starting with `-`: what the agent accepts too.
fn valid_unit(u: &str) -> bool {
    !u.is_empty()
        && u.len() <= 256
        && !u.starts_with('-')
        && u.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@:".contains(c))
}

impl std::fmt::Display for AgentStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentStep::RestartUnit(u) => write!(f, "@restart-unit {u}"),
            AgentStep::Reboot => f.write_str("@reboot"),
            AgentStep::CollectDiagnostics => f.write_str("@collect-diagnostics"),
        }
    }
}

impl CommandSpec {
    /// The built-in power action, if this is one.
    pub fn power_builtin(&self) -> Option<Builtin> {
        match self {
            CommandSpec::Builtin(b) if b.is_power() => Some(*b),
            _ => None,
        }
    }

    /// True for a step after which the machine should come back from a new boot: a power
    /// built-in or `@reboot`. The boot id before it is kept for `@agent-healthy`.
    pub fn changes_boot(&self) -> bool {
        self.power_builtin().is_some() || *self == CommandSpec::Agent(AgentStep::Reboot)
    }
}

impl std::fmt::Display for CommandSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandSpec::External(argv) => write!(f, "{}", argv.join(" ")),
            CommandSpec::Builtin(b) => f.write_str(b.name()),
            CommandSpec::Agent(a) => a.fmt(f),
        }
    }
}

/// One repair step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairStep {
    /// The command.
    pub repair_command: CommandSpec,
    /// Time limit per attempt in seconds; 0 = none.
    pub command_timeout_seconds: u64,
    /// Extra attempts after a failure.
    pub command_retries: u32,
    /// Seconds between attempts.
    pub command_interval: u64,
    /// Drain the node before the command.
    pub need_drain: bool,
    /// Seconds to watch the health check after the command before the next step.
    pub watch_seconds: u64,
}

/// One repair operation: steps for one operation name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOperation {
    /// Operation name.
    pub operation: String,
    /// Steps, in order.
    pub repair_steps: Vec<RepairStep>,
    /// Passes when its trimmed stdout is exactly `true`.
    pub health_check_command: CommandSpec,
    /// Time limit of the health check in seconds; 0 = none.
    pub command_timeout_seconds: u64,
    /// Run when the machine became healthy; its failure fails the entry.
    pub success_command: Option<CommandSpec>,
    /// Time limit of the success command in seconds; 0 = none.
    pub success_command_timeout: u64,
}

/// Operations for some machine types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairProcedure {
    /// Machine types this procedure applies to.
    pub machine_types: Vec<String>,
    /// Its operations.
    pub repair_operations: Vec<RepairOperation>,
}

/// The `repair:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairConfig {
    /// Procedures; the first whose `machine_types` holds the entry's type applies.
    pub repair_procedures: Vec<RepairProcedure>,
    /// Entries processed at once.
    pub max_concurrent_repairs: u32,
    /// Namespaces whose pods are evicted through the Eviction API; `None` = all.
    pub protected_namespaces: Option<LabelSelector>,
    /// Job pods whose presence blocks a drain; `None` = none.
    pub protected_job_pods: Option<LabelSelector>,
    /// Extra eviction attempts.
    pub evict_retries: u32,
    /// Seconds between eviction attempts.
    pub evict_interval: u64,
    /// Seconds a drain may take before it is abandoned and backed off.
    pub eviction_timeout_seconds: u64,
}

/// Why an entry has no operation to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoMatch {
    /// No procedure lists the machine type.
    #[error("no repair procedure for machine type `{0}`")]
    MachineType(String),
    /// The procedure has no such operation.
    #[error(
        "the repair procedure for machine type `{machine_type}` has no operation `{operation}`"
    )]
    Operation {
        /// The machine type.
        machine_type: String,
        /// The operation.
        operation: String,
    },
}

impl RepairConfig {
    /// The operation for a machine type and operation name, as CKE selects it.
    pub fn operation_for(
        &self,
        machine_type: &str,
        operation: &str,
    ) -> Result<&RepairOperation, NoMatch> {
        let proc = self
            .repair_procedures
            .iter()
            .find(|p| p.machine_types.iter().any(|t| t == machine_type))
            .ok_or_else(|| NoMatch::MachineType(machine_type.to_string()))?;
        proc.repair_operations
            .iter()
            .find(|o| o.operation == operation)
            .ok_or_else(|| NoMatch::Operation {
                machine_type: machine_type.to_string(),
                operation: operation.to_string(),
            })
    }

    /// What the drainer needs.
    pub fn drain_options(&self) -> DrainOptions {
        DrainOptions {
            protected_namespaces: self.protected_namespaces.as_ref().map(|s| s.to_query()),
            protected_job_pods: self.protected_job_pods.as_ref().map(|s| s.to_query()),
            evict_retries: self.evict_retries,
            evict_interval_seconds: self.evict_interval,
        }
    }
}
