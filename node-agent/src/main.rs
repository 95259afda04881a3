//! `node-agent`: parse configuration, set up logging, then either report until
//! SIGTERM/SIGINT (`run`, the default) or run the checks once (`check`). SIGHUP makes a
//! running agent read its configuration and TLS files again (see `node_agent::reload`).
//!
//! Exit codes: 0 after a clean stop or a healthy `check`, 1 when `check` finds a failing
//! check or the agent cannot start, 64 for a bad configuration. `check` exits 64 when `run`
//! would not start: TLS files it cannot read, an expired certificate, one from another CA
//! or not valid yet by this host's clock, one naming another host. `kdump-notify` (from the
//! kdump initramfs) reads no configuration and exits 0, 64 (bad input) or 69 (coordinator
//! unreachable or refusing).

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory as _, FromArgMatches as _};
use node_agent::agent::{Agent, AgentOptions};
use node_agent::checks::Checker;
use node_agent::cli;
use node_agent::config::{Cli, Command, Config, Settings};
use node_agent::kdump_notify::{KdumpNotifyArgs, Notify};
use node_agent::reload::Reloads;
use node_agent::systemd::{SdNotifier, SystemdShutdownProbe};

// Stack: every page of `main`'s frame is touched at start (stack probes) and stays
// resident for the agent's life, so what only the start or one command needs (clap's
// parser, `kdump-notify`'s runtime, the `run` future) lives in functions of its own, kept
// out of `main` by `#[inline(never)]`; inlined, they made `main`'s frame 86 KB
// (docs/benchmarks.md, "The agent's stack").
fn main() -> ExitCode {
    protocol::telemetry::quiet_broken_pipe();
    let cli = match parse() {
        Ok(c) => c,
        // The kdump initramfs scripts tell bad input (64) from an unreachable coordinator
        // (69); clap's own code for a bad flag would be 2.
        Err(e) if e.use_stderr() && std::env::args().any(|a| a == "kdump-notify") => {
            let _ = e.print();
            return ExitCode::from(64);
        }
        Err(e) => e.exit(),
    };
    if let Err(e) = protocol::telemetry::init("info") {
        eprintln!("node-agent: {e}");
        return ExitCode::from(64);
    }
    if let Some(Command::KdumpNotify(args)) = &cli.command {
        return kdump_notify(&cli.settings, args);
    }
    let cfg = match Config::load(&cli.settings) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent: {e}");
            return ExitCode::from(64);
        }
    };
    // One thread is plenty for one connection and a handful of file reads every few
    // seconds, and it keeps the agent's memory footprint and CPU wakeups minimal.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("node-agent: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match cli.command {
        Some(Command::Check { json }) => rt.block_on(check(cfg, json)),
        Some(Command::Run) | None => serve(&rt, cfg, cli.settings),
        Some(Command::KdumpNotify(_)) => unreachable!("handled before the config is loaded"),
    }
}

/// The command line; clap's builder is large on the stack, and needed only here.
#[inline(never)]
fn parse() -> Result<Cli, clap::Error> {
    Cli::command().try_get_matches().and_then(|m| {
        let mut cli = Cli::from_arg_matches(&m)?;
        cli.settings.note_origins(&m);
        Ok(cli)
    })
}

/// `run`: reports until stopped. The future is boxed, so the runtime's `block_on` moves a
/// pointer around instead of copying the agent's state machine (15 KB) into its frames
/// (tokio boxes only futures over 16 KB itself).
#[inline(never)]
fn serve(rt: &tokio::runtime::Runtime, cfg: Config, settings: Settings) -> ExitCode {
    rt.block_on(Box::pin(run(cfg, settings)))
}

/// `kdump-notify`: no config file, its own small runtime, sysexits codes.
#[inline(never)]
fn kdump_notify(settings: &Settings, args: &KdumpNotifyArgs) -> ExitCode {
    let notify = match Notify::new(settings, args) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("node-agent kdump-notify: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("node-agent kdump-notify: cannot start runtime: {e}");
            return ExitCode::from(69);
        }
    };
    match rt.block_on(notify.send()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent kdump-notify: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn check(cfg: Config, json: bool) -> ExitCode {
    let hostname = node_agent::node::hostname(&cfg.root, cfg.hostname.as_deref())
        .unwrap_or_else(|_| "(unknown)".into());
    let (mut setup, refused) = node_agent::agent::preflight::rows(&cfg);
    setup.extend(node_agent::actions::allowed::rows(&cfg));
    let results = Checker::new(&cfg).run().await;
    let healthy = cli::healthy(&results);
    // 64 when `run` would not start; else 1 when a check fails. A refused action is a line
    // to read, not a failure of this machine.
    let code = refused.unwrap_or(if healthy { 0 } else { 1 });
    if code != 0 {
        // `check | head -1` closes stdout while printing: still fail.
        protocol::telemetry::set_broken_pipe_exit(code);
    }
    if json {
        let out = cli::CheckOutput {
            hostname: &hostname,
            healthy,
            setup: &setup,
            checks: &results,
        };
        match serde_json::to_string_pretty(&out) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("node-agent: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        print!("{}", cli::table(&setup, &results));
    }
    ExitCode::from(code)
}

async fn run(cfg: Config, settings: Settings) -> ExitCode {
    // Installed before anything slow: from here on a SIGHUP cannot kill the agent.
    let reloads = match hangups() {
        Ok(requests) => Reloads {
            requests,
            load: Box::new(move || Config::load(&settings)),
        },
        Err(e) => {
            eprintln!("node-agent: cannot handle SIGHUP: {e}");
            return ExitCode::from(1);
        }
    };
    let checker = Checker::new(&cfg);
    let probe = Box::new(SystemdShutdownProbe::new(cfg.root.clone()));
    let agent = match Agent::new(
        cfg,
        checker,
        Arc::new(SdNotifier::from_env()),
        probe,
        AgentOptions::default(),
    ) {
        Ok(a) => a,
        Err(e) => {
            // Logged once, as the coordinator does: stderr is the log under systemd.
            tracing::error!(error = %e, "cannot start");
            return ExitCode::from(e.exit_code());
        }
    };
    let summary = agent.with_reloads(reloads).run(stop_signal()).await;
    tracing::info!(
        reports = summary.reports_acked,
        goodbye_acked = summary.goodbye_acked,
        "stopped"
    );
    ExitCode::SUCCESS
}

/// One message per SIGHUP received.
fn hangups() -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration and TLS files");
            if tx.send(()).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Completes on the first SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}
