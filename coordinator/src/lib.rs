//! Fleetmend coordinator: inventory and live health, detectors and limits, the repair queue,
//! drains through the Kubernetes API, and fencing through rack BMC gateways.

pub mod k8s;
pub mod repair;
