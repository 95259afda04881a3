//! Fleetmend coordinator: inventory and live health, detectors and limits, the repair queue,
//! drains through the Kubernetes API, and fencing through rack BMC gateways.
//!
//! Logic lives in this library; the `coordinator` and `coordinatorctl` binaries are thin.

pub mod admin;
pub mod agent_link;
pub mod agent_server;
pub mod app;
pub mod certs;
pub mod check;
pub mod clock;
pub mod config;
pub mod ctl;
pub mod duration;
pub mod fence;
pub mod fleet;
pub mod gateway;
pub mod ha;
pub mod health;
pub mod inventory;
pub mod k8s;
pub mod kdump;
pub mod leadership;
pub mod lease_token;
pub mod lifecycle;
pub mod metrics;
pub mod remediation;
pub mod repair;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
