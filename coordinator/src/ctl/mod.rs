//! `coordinatorctl`: the operator's command line.
//!
//! Commands are grouped (`pki`, `machines`, …); each group is a clap `Subcommand` enum in
//! its own file implementing [`CommandGroup`], listed once in the [`command_groups!`]
//! invocation below. Another area adds its group with one line there, e.g.
//! `RepairQueue(crate::repair::ctl::RepairQueueCommand),` (its `///` doc becomes the help).
//!
//! Connection settings for commands that talk to a coordinator come from flags or the
//! environment (`FLEETMEND_SERVER`, `FLEETMEND_CA`, `FLEETMEND_CERT`, `FLEETMEND_KEY`); a
//! connection is only opened by commands that need one. Errors use `anyhow`: this is a CLI.

pub mod client;
pub mod machines;
pub mod pki;

use std::future::Future;

use clap::{Parser, Subcommand};

pub use client::{AdminClient, ConnectArgs};

/// What a command group gets to run.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Connection settings (used only by commands that connect).
    pub connect: ConnectArgs,
}

impl Ctx {
    /// Connects to the coordinator with an admin certificate.
    pub async fn client(&self) -> anyhow::Result<AdminClient> {
        AdminClient::connect(&self.connect).await
    }
}

/// A group of subcommands.
pub trait CommandGroup {
    /// Runs the chosen command.
    fn run(self, ctx: &Ctx) -> impl Future<Output = anyhow::Result<()>>;
}

/// Declares the top-level command enum and its dispatch from a list of groups.
macro_rules! command_groups {
    ($( $(#[$meta:meta])* $variant:ident($group:ty), )*) => {
        /// Command groups.
        #[derive(Debug, Subcommand)]
        pub enum Command {
            $( $(#[$meta])* #[command(subcommand)] $variant($group), )*
        }

        impl Command {
            /// Runs the chosen command.
            pub async fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
                match self {
                    $( Command::$variant(c) => CommandGroup::run(c, ctx).await, )*
                }
            }
        }
    };
}

command_groups! {
    /// Fleet PKI: create the CA, issue certificates.
    Pki(pki::PkiCommand),
    /// Inventory and live health of machines.
    Machines(machines::MachinesCommand),
    /// The repair queue (as `ckecli repair-queue`).
    RepairQueue(crate::repair::ctl::RepairQueueCommand),
}

/// Fleetmend's operator CLI.
#[derive(Debug, Parser)]
#[command(name = "coordinatorctl", version)]
pub struct Cli {
    /// How to reach the coordinator.
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let ctx = Ctx {
        connect: cli.connect,
    };
    cli.command.run(&ctx).await
}

/// Formats a Unix-millisecond time as RFC 3339 (seconds) for tables.
pub fn fmt_time(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(0))
        .map(|t| {
            t.round(jiff::Unit::Second)
                .map(|t| t.to_string())
                .unwrap_or_default()
        })
        .unwrap_or_else(|_| "-".into())
}

/// Formats how long ago a Unix-millisecond time was: `12s`, `5m`, `3h`, `2d`.
pub fn fmt_age(ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(ms) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// Prints rows as a left-aligned table with a header.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(fmt_age(0, 59_000), "59s");
        assert_eq!(fmt_age(0, 120_000), "2m");
        assert_eq!(fmt_age(0, 7_200_000), "2h");
    }
}
