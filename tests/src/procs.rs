//! Running Fleetmend binaries as real processes: the process plumbing ([`crate::process`]:
//! finding and building the binaries, a PKI made by the real `coordinatorctl pki`, children
//! killed on drop with their logs, waits with timeouts) and the coordinator process
//! ([`crate::coordinator_proc`]), under one name for the tests.

pub use crate::coordinator_proc::{Coordinator, CoordinatorOptions};
pub use crate::process::*;
