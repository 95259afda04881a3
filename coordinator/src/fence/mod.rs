//! Fencing: proving a machine is off before its workload is released, then bringing it back.
//!
//! - [`proof`]: the types that make "no workload release without confirmed power-off or a
//!   kdump in progress" (invariant 1) a compile-time fact,
//! - [`flow`]: the fence flow as a pure state machine (power off → confirm off → release →
//!   wait released → power on → wait back → restore),
//! - [`hold`]: what a flow that waits without moving says in its history, and why,
//! - [`store`]: its state behind [`store::FenceStore`] (SQLite tables: migration 0007),
//! - [`runner`]: the I/O around the step function, over the power, node-release and
//!   agent-health traits, resumable after a restart,
//! - [`killpoint`]: crash-test kill points, compiled only into test builds,
//! - [`kdump`]: what the flow reads of a machine's crash dump (the kdump leg is in
//!   [`flow::kdump`]),
//! - [`admin`]: the admin API's read-only view of flows (`coordinatorctl fence`),
//! - [`metrics`]: flows started, finished and running, for `/metrics`.
//!
//! The repair queue's `@fence` wiring lives in [`crate::repair::fencing`].

pub mod admin;
pub mod flow;
pub mod hold;
pub mod kdump;
pub mod killpoint;
pub mod metrics;
pub mod proof;
pub mod runner;
pub mod store;
