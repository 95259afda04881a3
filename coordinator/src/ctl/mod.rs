//! `coordinatorctl`: the operator's command line.
//!
//! Commands are grouped (`pki`, `machines`, …); each group is a clap `Subcommand` enum in
//! its own file implementing [`CommandGroup`], listed once in the [`command_groups!`]
//! invocation below. Another area adds its group with one line there, e.g.
//! `RepairQueue(repair_queue::RepairQueueCommand),` (its `///` doc becomes the help). What
//! every group shares (the context, table and time formatting) is in [`common`].
//!
//! Connection settings for commands that talk to a coordinator come from flags, then
//! `FLEETMEND_CTL_*` variables, then the profile file (`~/.config/fleetmend/coordinatorctl.toml`
//! or `--profile`), see [`profile`]; a connection is only opened by commands that need one,
//! and the offline groups listed in [`OFFLINE_GROUPS`] do not show the connection options
//! in their help. Errors use `anyhow`: this is a CLI.

pub mod client;
pub mod common;
pub mod diagnostics;
pub mod fence;
pub mod machines;
pub mod machines_list;
pub mod pki;
pub mod profile;
pub mod remediation;
pub mod repair_queue;
pub mod status;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Fence flows: power off, confirm, release, power on, restore.
    Fence(fence::FenceCommand),
    /// Each coordinator of --server and its role: who leads, the epoch, since when.
    Status(status::StatusCommand),
}

/// Fleetmend's operator CLI.
#[derive(Debug, Parser)]
#[command(name = "coordinatorctl", version = protocol::VERSION)]
pub struct Cli {
    /// How to reach the coordinator.
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Command groups that never connect: their help leaves out the connection options.
pub const OFFLINE_GROUPS: &[&str] = &["pki"];

/// The connection options' argument ids (hidden in [`OFFLINE_GROUPS`]).
const CONNECTION_ARGS: &[&str] = &[
    "profile",
    "server",
    "server_name",
    "ca",
    "cert",
    "key",
    "timeout",
];

/// The clap command as `coordinatorctl` parses it: [`Cli`] with the connection options
/// hidden from the help of offline groups (they are still accepted there, so a profile in
/// the environment never breaks `pki`).
pub fn command() -> clap::Command {
    let mut cmd = Cli::command();
    // Global options are copied into subcommands when the command is built, except where a
    // subcommand already has an option of that id: give offline groups hidden copies first.
    let hidden: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| CONNECTION_ARGS.contains(&a.get_id().as_str()))
        .map(|a| a.clone().hide(true))
        .collect();
    for group in OFFLINE_GROUPS {
        cmd = cmd.mut_subcommand(group, |mut g| {
            for a in &hidden {
                g = g.arg(a.clone());
            }
            g
        });
    }
    cmd
}

/// Parses the process's command line (exits with clap's usage error or help; a bad value
/// clap read from a `FLEETMEND_CTL_*` variable is blamed on the variable, not its flag) and
/// notes which connection settings came from the environment.
pub fn parse() -> Cli {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = command()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| client::blame_environment(e, &args).exit());
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.connect.note_sources(&matches);
    cli
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

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn offline_groups_hide_the_connection_options_but_accept_them() {
        let help = command()
            .try_get_matches_from(["coordinatorctl", "pki", "init", "--help"])
            .unwrap_err()
            .to_string();
        assert!(help.contains("--out"), "{help}");
        assert!(!help.contains("--server"), "{help}");
        let help = command()
            .try_get_matches_from(["coordinatorctl", "machines", "list", "--help"])
            .unwrap_err()
            .to_string();
        assert!(help.contains("--server"), "{help}");
        assert!(
            command()
                .try_get_matches_from([
                    "coordinatorctl",
                    "pki",
                    "init",
                    "--out",
                    "d",
                    "--server",
                    "h:1"
                ])
                .is_ok()
        );
    }

    #[test]
    fn environment_settings_are_told_apart_from_flags() {
        // `env` values are given through clap's own lookup, so this test sets nothing in the
        // process environment: it checks the flag side and the bookkeeping.
        let m = command()
            .try_get_matches_from(["coordinatorctl", "--cert", "c.pem", "machines", "list"])
            .unwrap();
        let mut cli = Cli::from_arg_matches(&m).unwrap();
        cli.connect.note_sources(&m);
        assert!(cli.connect.from_env.is_empty());
    }

    #[test]
    fn a_bad_value_from_the_environment_names_the_variable_not_the_flag() {
        // clap's own error for the value, as it is made when the value is typed; the
        // environment cannot be set in a test (tests/tests/operator.rs runs the binary
        // with FLEETMEND_CTL_TIMEOUT set).
        let typed = |args: &[&str]| -> Vec<std::ffi::OsString> {
            args.iter().map(std::ffi::OsString::from).collect()
        };
        let clap_error = command()
            .try_get_matches_from(["coordinatorctl", "--timeout", "5", "machines", "list"])
            .unwrap_err();
        let flag_said = clap_error.to_string();
        assert!(flag_said.contains("'--timeout <TIMEOUT>'"), "{flag_said}");
        // Typed: unchanged.
        let e = client::blame_environment(
            clap_error,
            &typed(&["coordinatorctl", "--timeout", "5", "machines", "list"]),
        );
        assert_eq!(e.to_string(), flag_said);
        // Not typed: the value came from the variable.
        let e = client::blame_environment(e, &typed(&["coordinatorctl", "machines", "list"]));
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "error: invalid value '5' in the environment variable FLEETMEND_CTL_TIMEOUT (read for --timeout, which was not given): "
            ) && msg.contains("unit")
                && msg.ends_with("For more information, try '--help'.\n"),
            "{msg}"
        );
        assert!(!msg.contains("'--timeout <TIMEOUT>'"), "{msg}");
        assert_eq!(e.exit_code(), 2, "a usage error, as before");
        // `--timeout=5` is typed too.
        let e = command()
            .try_get_matches_from(["coordinatorctl", "--timeout=5", "machines", "list"])
            .unwrap_err();
        let e = client::blame_environment(e, &typed(&["coordinatorctl", "--timeout=5"]));
        assert!(e.to_string().contains("'--timeout <TIMEOUT>'"), "{e}");
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(fmt_age(0, 59_000), "59s");
        assert_eq!(fmt_age(0, 120_000), "2m");
        assert_eq!(fmt_age(0, 7_200_000), "2h");
    }
}
