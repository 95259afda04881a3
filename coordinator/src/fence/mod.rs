//! Fencing: proving a machine is off before its workload is released.
//!
//! For now this holds only [`proof`], the types that make "no workload release without
//! confirmed power-off or a kdump in progress" (invariant 1) a compile-time fact. The fence
//! flow itself (power off → confirm → release → power on → restore, persisted step by step)
//! belongs here too and is built by the fencing issue.

pub mod proof;
