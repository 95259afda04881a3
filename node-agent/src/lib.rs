//! Fleetmend node-agent: runs on every server, checks kubelet, required NICs, required
//! filesystems and kdump readiness (and, where configured or present, plugin scripts on
//! node-problem-detector's contract, NVIDIA GPU Xid errors and EDAC memory ECC counters), and
//! reports them to the coordinator over one long-lived mutual-TLS QUIC connection.
//!
//! - [`config`]: TOML file, environment and flags,
//! - [`checks`]: the health checks, each over a root directory so tests use fixture trees,
//! - [`node`]: the facts in the agent's hello (hostname, serial, addresses, boot id),
//! - [`agent`]: the reporting loop with reconnects and goodbye,
//! - [`actions`]: the few actions the coordinator may ask for (restart an allowed unit,
//!   clean reboot, diagnostics), each only when `[actions]` enables it,
//! - [`backoff`]: reconnect delays,
//! - [`systemd`]: `sd_notify` and telling a system shutdown from an agent restart,
//! - [`timer`]: timers on a timerfd, for the wait between reports and quinn's timers,
//! - [`reload`]: what a SIGHUP may change in a running agent,
//! - [`cli`]: the `check` subcommand's output,
//! - [`kdump_notify`]: the `kdump-notify` subcommand, run from the kdump initramfs.
//!
//! The agent deliberately decides nothing about repairs; it observes, reports, and carries
//! out the actions its configuration allows when the coordinator asks.
//! It must stay small (resident memory under 8 MiB): no HTTP library, a single-threaded
//! runtime, no allocation-heavy work per cycle.

pub mod actions;
pub mod agent;
pub mod backoff;
pub mod checks;
pub mod cli;
pub mod config;
pub mod kdump_notify;
pub mod node;
pub mod reload;
pub mod systemd;
pub mod timer;

#[cfg(test)]
#[allow(unreachable_pub, dead_code, missing_docs)]
#[path = "../../tests/src/fixture.rs"]
mod testkit_fixture;
