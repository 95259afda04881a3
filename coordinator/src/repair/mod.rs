//! The repair queue: CKE's repair semantics, durable in the store ([`store::RepairQueueStore`]).
//!
//! - [`config`]: the `repair:` section as types (CKE's keys and defaults, `@` built-in
//!   actions), and [`load`]: reading it from YAML with strict validation,
//! - [`entry`]: queue entries and where each stands inside its step,
//! - [`decide`]: the pure step decision and transitions, unit-tested case by case,
//! - [`admin`]: the pure meaning of admin requests (writes and replies),
//! - [`command`]: running external commands and built-ins, and [`run_context`]: what every
//!   run shares (its context, how it ended, the agent health it reads),
//! - [`agent_steps`]: the steps the machine's agent carries out (`@restart-unit`,
//!   `@reboot`, `@collect-diagnostics`), and [`diagnostics`]: where their bundles are kept,
//! - [`orphans`]: the record of running commands' process groups, and the kill of those a
//!   killed coordinator left behind,
//! - [`store`]: the repair area's state behind its interfaces (queue, command groups,
//!   diagnostics), with their SQLite implementation,
//! - [`engine`]: the task that owns the queue: its handle, loop, step and commit,
//! - [`tasks`]: bookkeeping of the tasks each entry runs and what they reported,
//! - [`effects`]: what an action does once committed (commands, drains, uncordon, Events),
//! - [`fencing`]: `@fence` steps and drains of dead nodes run the durable fence flow,
//! - [`metrics`]: the queue's `/metrics` series,
//! - [`wiring`]: starting it from the app.
//!
//! `coordinatorctl repair-queue` lives with the rest of the CLI, in `crate::ctl`.
//!
//! Drains go through [`crate::k8s::Drainer`], power actions through
//! [`crate::gateway::PowerControl`], agent health through [`AgentHealthView`]; this module
//! deliberately implements none of those systems.

pub mod admin;
pub mod agent_steps;
pub mod command;
pub mod config;
pub mod decide;
pub mod diagnostics;
mod effects;
pub mod engine;
pub mod entry;
mod evidence;
pub mod fencing;
pub mod load;
pub mod metrics;
pub mod orphans;
mod power_steps;
pub mod run_context;
pub mod store;
mod tasks;
pub mod wiring;

pub use admin::{RepairQueueError, Requester};
pub use command::{AgentHealth, AgentHealthView, NoAgents, NoReport};
pub use config::RepairConfig;
pub use engine::{RepairDeps, RepairQueue};
pub use load::load_file;
pub use metrics::RepairMetrics;
pub use wiring::{RepairStartError, start_for_app};
