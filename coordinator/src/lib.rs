//! Fleetmend coordinator: inventory and live health, detectors and limits, the repair queue,
//! drains through the Kubernetes API, and fencing through rack BMC gateways.
//!
//! Logic lives in this library; the `coordinator` and `coordinatorctl` binaries are thin.

pub mod clock;
pub mod fence;
pub mod gateway;
pub mod k8s;
pub mod repair;
pub mod store;
