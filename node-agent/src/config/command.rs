//! The agent's command line: its subcommands, each with its own arguments, over the
//! settings ([`super::Settings`]) that every subcommand shares.

use clap::{Parser, Subcommand};

use super::Settings;

/// The agent's command line.
#[derive(Debug, Parser)]
#[command(
    name = "node-agent",
    version = protocol::VERSION,
    about = "Fleetmend node agent: reports this server's health to the coordinator",
    after_help = "Signals: SIGTERM/SIGINT say goodbye to the coordinator and stop. SIGHUP re-reads the \
configuration and the TLS files: the new report interval, checks and coordinator apply at once \
(a changed coordinator reconnects), a new certificate from the next connection; settings that \
do not load or name another node are refused with an error log and the running ones kept."
)]
pub struct Cli {
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings, accepted before or after the subcommand.
    #[command(flatten)]
    pub settings: Settings,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report health to the coordinator until SIGTERM/SIGINT (the default); SIGHUP reloads
    /// the configuration and TLS files, keeping the running ones if the new ones are invalid.
    Run,
    /// Run every check once and print the results, after what decides whether `run` can
    /// work (its TLS files, the actions it allows); exit 1 if a check fails, 64 if `run`
    /// would not start.
    Check {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// From the kdump initramfs: tell the coordinator this machine's crash dump started or
    /// is written. Reads no config file: give --coordinator, --ca, --cert and --key. Exit
    /// codes: 0 recorded, 64 bad input, 69 coordinator unreachable or refusing.
    KdumpNotify(Box<crate::kdump_notify::KdumpNotifyArgs>),
}
