//! `bmc-gateway`: parse the command line and config, init tracing, run until SIGTERM/SIGINT
//! (SIGHUP reloads the TLS files, see `bmc_gateway::reload`), exit 64 on a bad
//! configuration. Everything else lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bmc_gateway::config::Config;
use bmc_gateway::reload::Reloads;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Exit code for a bad configuration (EX_USAGE / sysexits' 64).
const EXIT_CONFIG: u8 = 64;

/// Rack BMC gateway: executes power actions for the Fleetmend coordinator over IPMI and Redfish.
///
/// Signals: SIGTERM/SIGINT stop it: no new requests are taken, those already taken are answered
/// (within 10 s), then it exits. SIGHUP re-reads the configuration
/// and puts the TLS files in place for new connections (certificate renewal); changes to
/// BMCs, PDUs, credentials (also the contents of a BMC's or PDU's password or community file),
/// limits or listen addresses are reported and need a restart. Files that do not load, or a certificate naming another
/// identity or not valid under the CA, are refused with an error log and the running ones
/// kept.
#[derive(Debug, Parser)]
#[command(name = "bmc-gateway", version = protocol::VERSION)]
struct Cli {
    /// Configuration file.
    #[arg(
        long,
        global = true,
        env = protocol::env_var!(GATEWAY, "CONFIG"),
        default_value = "/etc/fleetmend/bmc-gateway.toml"
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Read the power state of every configured BMC and print a table.
    ///
    /// Also checks the TLS files as the start does (they load, the key is the certificate's,
    /// it names a gateway and chains to `ca`) and prints a `tls` line under the table, then a
    /// `state` line saying whether a running gateway holds `state_dir` (and its pid: a second
    /// gateway on it refuses to start); with `--json` a TLS or state problem goes to stderr.
    /// Exit 1 when a BMC or the TLS files fail, or the state directory cannot be looked at.
    Check {
        /// Time limit per BMC (`15s`, `500ms`, `1m`).
        #[arg(long, default_value = "15s", value_parser = protocol::duration::limit)]
        timeout: Duration,
        /// Print JSON (one object per BMC) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    protocol::telemetry::quiet_broken_pipe();
    let cli = Cli::parse();
    // `check` is a command a person reads: its table on stdout, the gateway's own warnings
    // on stderr, not a line per IPMI session opened, nor a library's warning about what the
    // table already says (ipmi-rs logs "RMCP+ error occurred" for a refused login); a
    // library's errors still show. FLEETMEND_LOG still overrides.
    let default_level = match cli.command {
        Some(Command::Check { .. }) => "error,bmc_gateway=warn,protocol=warn",
        _ => "info",
    };
    if let Err(e) = protocol::telemetry::init(default_level) {
        eprintln!("bmc-gateway: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let cfg = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bmc-gateway: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bmc-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::Check { timeout, json } => rt.block_on(async {
            let tls = bmc_gateway::tls::check(&cfg.tls);
            let state = bmc_gateway::state_lock::holder(&cfg.state_dir);
            let rows = bmc_gateway::check(&cfg, timeout).await;
            let healthy =
                tls.is_ok() && state.is_ok() && rows.iter().all(|r| r.result.is_ok());
            if !healthy {
                // `check | head -1` closes stdout while printing: still fail.
                protocol::telemetry::set_broken_pipe_exit(1);
            }
            if json {
                let v: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "machine": r.machine,
                            "protocol": r.protocol,
                            "bmc": r.bmc,
                            "power": r.result.as_ref().ok().map(|p| format!("{:?}", p.state).to_lowercase()),
                            "detail": r.result.as_ref().ok().and_then(|p| p.note.as_deref()),
                            "error": r.result.as_ref().err(),
                        })
                    })
                    .collect();
                match serde_json::to_string_pretty(&v) {
                    Ok(s) => println!("{s}"),
                    Err(e) => eprintln!("bmc-gateway: {e}"),
                }
                if let Err(e) = &tls {
                    eprintln!("bmc-gateway: tls: {e}");
                }
                match &state {
                    Ok(Some(pid)) => eprintln!(
                        "bmc-gateway: state_dir {} is held by the gateway with pid {pid}",
                        cfg.state_dir.display()
                    ),
                    Ok(None) => {}
                    Err(e) => eprintln!("bmc-gateway: state_dir: {e}"),
                }
            } else {
                print!("{}", bmc_gateway::render_check(&rows));
                print!("{}", bmc_gateway::tls::render_check(&tls));
                print!(
                    "{}",
                    bmc_gateway::state_lock::render_check(&cfg.state_dir, &state)
                );
            }
            if healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }),
        Command::Run => rt.block_on(async {
            let stop = CancellationToken::new();
            let (hup_tx, hup_rx) = tokio::sync::mpsc::unbounded_channel();
            if let Err(e) = install_signals(stop.clone(), hup_tx) {
                error!(error = %e, "cannot install signal handlers");
                return ExitCode::FAILURE;
            }
            let reloads = Reloads {
                path: cli.config.clone(),
                requests: hup_rx,
            };
            let r = bmc_gateway::run(cfg, stop.clone(), Some(reloads), |_| {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
                if let Some(period) = sd_notify::watchdog_enabled() {
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        // Half the watchdog period, as systemd recommends.
                        let mut tick = tokio::time::interval(period / 2);
                        while !stop.is_cancelled() {
                            tick.tick().await;
                            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                        }
                    });
                }
            })
            .await;
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!(error = %e, "bmc-gateway failed");
                    if e.is_retriable() {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::from(EXIT_CONFIG)
                    }
                }
            }
        }),
    }
}

/// Installs the handlers now (a signal arriving before is not lost to the default action
/// after this returns) and serves them in a task: SIGTERM/SIGINT cancel `stop`, each SIGHUP
/// is forwarded to `hup`.
fn install_signals(
    stop: CancellationToken,
    hup: tokio::sync::mpsc::UnboundedSender<()>,
) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM: stopping"); break; }
                _ = int.recv() => { info!("SIGINT: stopping"); break; }
                _ = hangup.recv() => {
                    info!("SIGHUP: reading the configuration and TLS files again");
                    let _ = hup.send(());
                }
            }
        }
        stop.cancel();
    });
    Ok(())
}
