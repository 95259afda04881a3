//! `coordinatorctl`: the operator's command line.
//!
//! Commands are grouped (`pki`, `machines`, …); each group is a clap `Subcommand` enum in
//! its own file implementing [`CommandGroup`], listed once in the [`command_groups!`]
//! invocation below. Another area adds its group with one line there, e.g.
//! `RepairQueue(repair_queue::RepairQueueCommand),` (its `///` doc becomes the help). What
//! every group shares (the context, table and time formatting) is in [`common`].
//!
//! Connection settings for commands that talk to a coordinator come from flags or the
//! environment (`FLEETMEND_SERVER`, `FLEETMEND_CA`, `FLEETMEND_CERT`, `FLEETMEND_KEY`); a
//! connection is only opened by commands that need one. Errors use `anyhow`: this is a CLI.

pub mod client;
pub mod common;
pub mod diagnostics;
pub mod machines;
pub mod pki;
pub mod remediation;
pub mod repair_queue;

use clap::{Parser, Subcommand};

pub use client::{AdminClient, ConnectArgs};
pub use common::{CommandGroup, Ctx, fmt_age, fmt_time, print_table};

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
    RepairQueue(repair_queue::RepairQueueCommand),
    /// Diagnostics collected from agents by repair steps.
    Diagnostics(diagnostics::DiagnosticsCommand),
    /// sabakan-style auto-repair (as `ckecli auto-repair`).
    AutoRepair(remediation::AutoRepairCommand),
    /// Constraints auto-repair obeys (as `ckecli constraints`).
    Constraints(remediation::ConstraintsCommand),
    /// Automatic remediation: pause, resume, observe, status, confirm an outage.
    Remediation(remediation::RemediationCommand),
    /// The decision journal: every remediation decision and why.
    Events(remediation::EventsArgs),
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
