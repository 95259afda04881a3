//! The repair queue: CKE's repair semantics, durable in SQLite.
//!
//! - [`config`]: the `repair:` YAML section (CKE's keys and defaults, strict validation,
//!   `@` built-in actions),
//! - [`entry`]: queue entries and where each stands inside its step,
//! - [`decide`]: the pure step decision and transitions, unit-tested case by case,
//! - [`command`]: running external commands and built-ins,
//! - [`orphans`]: the record of running commands' process groups, and the kill of those a
//!   killed coordinator left behind,
//! - [`store`]: the SQLite tables of migration 0002,
//! - [`engine`]: the task that owns the queue, answers admin requests and acts,
//! - [`ctl`]: `coordinatorctl repair-queue`,
//! - [`wiring`]: starting it from the app.
//!
//! Drains go through [`crate::k8s::Drainer`], power actions through
//! [`crate::gateway::PowerControl`], agent health through [`AgentHealthView`]; this module
//! deliberately implements none of those systems.

pub mod command;
pub mod config;
pub mod ctl;
pub mod decide;
pub mod engine;
pub mod entry;
pub mod orphans;
pub mod store;
pub mod wiring;

pub use command::{AgentHealth, AgentHealthView, NoAgents};
pub use config::{RepairConfig, load_file};
pub use engine::{RepairDeps, RepairMetrics, RepairQueue, RepairQueueError};
pub use wiring::{RepairStartError, start_for_app};
