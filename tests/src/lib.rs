//! Fleetmend's test kit: helpers shared by the end-to-end tests in `tests/tests/`.
//!
//! - [`fixture`]: fake sysfs/procfs trees for node-agents,
//! - [`ctl_json`]: what `coordinatorctl … --json` prints, typed as a script reads it,
//! - [`procs`]: building PKIs and running Fleetmend binaries as real processes,
//! - [`fake_k8s`]: a fake Kubernetes API server speaking the real JSON over HTTP,
//! - [`etcd`]: a real etcd on loopback, one member or a cluster, with faults and client TLS,
//! - [`real_k8s`]: a real etcd, kube-apiserver and kube-controller-manager on loopback, with
//!   played kubelets and CSI attacher,
//! - [`fake_sabakan`]: a small sabakan GraphQL server (`searchMachines`),
//! - [`bmc_sim`]: launchers for `ipmi_sim` and `sushy-emulator`.

pub mod bmc_sim;
pub mod coordinator_proc;
pub mod ctl_json;
pub mod etcd;
pub mod fake_k8s;
pub mod fake_sabakan;
pub mod fixture;
pub mod go_peers;
pub mod pdu_sim;
pub mod process;
pub mod procs;
pub mod real_k8s;
pub mod relay;
pub mod tcp_relay;
