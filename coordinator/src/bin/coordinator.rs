//! The coordinator daemon: parse config → init tracing → build → serve until SIGTERM/SIGINT
//! → drain within the grace → exit code (0 clean, 64 bad configuration, 1 other failure).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use coordinator::app::{Bound, Ended};
use coordinator::clock::SystemClock;
use coordinator::config::{Config, DEFAULT_CONFIG_PATH};
use coordinator::ha::EXIT_DEPOSED;
use tokio_util::sync::CancellationToken;

/// Exit code for an unusable configuration (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

/// Fleetmend coordinator: inventory, live health, repairs.
///
/// Signals: SIGTERM or SIGINT stop it cleanly (running repair commands are killed and run
/// again after the next start). SIGHUP reads the TLS files again: a renewed certificate is
/// used for new connections. The configuration is read only at start: restart to apply a
/// change to it (a restart resumes every repair where it stood). Only one coordinator may use a database: a second one is
/// refused, naming the lock file `<database>.lock` and the pid holding it.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version = protocol::VERSION)]
struct Args {
    /// Configuration file (TOML).
    #[arg(long, global = true, env = protocol::env_var!(COORDINATOR, "CONFIG"), default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// What to do (default: run).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the coordinator (the default).
    Run,
    /// Load and validate everything the coordinator uses at start (configuration, TLS files
    /// and their chain to the CA, inventory and what it would change in the database, repair
    /// file and whether the active repairs keep their procedures, whether power steps have a
    /// gateway and remediation's operations a procedure, database writable, kubeconfig)
    /// without starting it or changing anything; print what was found; exit 0, or 64 when
    /// anything is unusable.
    Check {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Copy the database (`database` in the configuration) to a new file, consistently,
    /// while the coordinator runs. Run as the database's owner (`runuser -u fleetmend --`).
    Backup {
        /// The copy to make; never overwritten.
        #[arg(long)]
        to: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put a backup in place of the database, under a new store identity (so that no
    /// gateway takes a new power request for one it executed before the restore). The
    /// coordinator must be stopped; the database replaced is kept beside it as
    /// `<database>.replaced-<unix seconds>`.
    Restore {
        /// The backup (made by `coordinator backup`).
        #[arg(long)]
        from: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a SQLite store into the etcd store that `[store]` names (backend = "etcd"),
    /// every area, and print what was copied. The SQLite file is only read (under its lock:
    /// stop its coordinator first); the etcd prefix must be empty; the etcd store gets a
    /// new identity. A copy cut short is started over by running the command again.
    Migrate {
        /// The SQLite database to copy (the old `database`).
        #[arg(long, value_name = "FILE")]
        from_sqlite: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// On etcd (`[store] backend = "etcd"`), after an etcd snapshot was restored: give the
    /// store a new identity, so that no gateway answers a new power request with an old
    /// result. Refused while a leader key is there (a coordinator leads, or the snapshot's
    /// key has not run out): exit 75, naming it. On SQLite, `coordinator restore` does this.
    RenewIdentity {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    protocol::telemetry::quiet_broken_pipe();
    let args = Args::parse();
    if let Some(Command::Check { json }) = args.command {
        let mut lines = coordinator::check::check(&args.config);
        // What would stop the start before the configuration is read.
        if let Err(e) = protocol::telemetry::check_env() {
            lines.insert(
                0,
                coordinator::check::CheckLine {
                    what: "logging",
                    ok: false,
                    detail: e.to_string(),
                },
            );
        }
        if json {
            match serde_json::to_string_pretty(&lines) {
                Ok(s) => println!("{s}"),
                Err(e) => eprintln!("coordinator: {e}"),
            }
        } else {
            print!("{}", coordinator::check::render(&lines));
        }
        return if lines.iter().all(|l| l.ok) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_CONFIG)
        };
    }
    let config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("coordinator: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if matches!(
        args.command,
        Some(Command::Backup { .. } | Command::Restore { .. })
    ) && config.store.backend == coordinator::store::config::Backend::Etcd
    {
        eprintln!(
            "coordinator: [store] backend = \"etcd\": `coordinator backup` and `restore` work on a \
             SQLite file only. On etcd, back up with `etcdctl snapshot save FILE`; to restore, \
             stop every coordinator, restore the snapshot (`etcdutl snapshot restore`), and run \
             `coordinator renew-identity` before any coordinator starts (docs/operations.md, \
             \"Backup and restore on etcd\"), so that no gateway answers a new power request \
             with an old result"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    match args.command {
        Some(Command::Backup { to, json }) => {
            return store_command(
                json,
                coordinator::store::backup::backup(&config.database, &to),
            );
        }
        Some(Command::Restore { from, json }) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            return store_command(
                json,
                coordinator::store::backup::restore(&config.database, &from, now),
            );
        }
        Some(Command::Migrate { from_sqlite, json }) => {
            return migrate(&config, &from_sqlite, json);
        }
        Some(Command::RenewIdentity { json }) => return renew_identity(&config, json),
        _ => {}
    }
    if let Err(e) = protocol::telemetry::init("info") {
        eprintln!("coordinator: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(async move {
        let bound = match Bound::open(config, std::sync::Arc::new(SystemClock)).await {
            Ok(b) => b,
            Err(e) => return cannot_start(&e),
        };
        let shutdown = CancellationToken::new();
        let loaded = Loaded::default();
        tokio::spawn(wait_for_signal(shutdown.clone(), loaded.clone()));
        let ready = || {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
            if let Some(period) = sd_notify::watchdog_enabled() {
                tokio::spawn(watchdog(period, loaded.clone(), shutdown.clone()));
            }
        };
        // On etcd a standby is started: its ports answer (as a standby) until it leads,
        // which may be never. On SQLite READY waits for the load, so a bad inventory or
        // repair file fails the start itself.
        let elected = bound.is_elected();
        if elected {
            ready();
        }
        let app = match bound.lead(&shutdown).await {
            Ok(Some(app)) => app,
            Ok(None) => {
                tracing::info!("stopped before leading");
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                return ExitCode::SUCCESS;
            }
            Err(e) => return cannot_start(&e),
        };
        let _ = loaded.tls.set(app.tls_reloader());
        let _ = loaded.fleet.set(app.fleet.clone());
        if !elected {
            ready();
        }
        let ended = app.run(shutdown).await;
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        match ended {
            Ended::Stopped => ExitCode::SUCCESS,
            Ended::Deposed => ExitCode::from(EXIT_DEPOSED),
        }
    })
}

/// What the signal handler and the watchdog use once the coordinator has loaded (it leads).
#[derive(Clone, Default)]
struct Loaded {
    tls: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<coordinator::certs::TlsReloader>>>,
    fleet: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<coordinator::fleet::Fleet>>>,
}

fn cannot_start(e: &coordinator::app::AppError) -> ExitCode {
    tracing::error!(error = %e, "cannot start");
    if e.is_config() {
        ExitCode::from(EXIT_CONFIG)
    } else {
        ExitCode::FAILURE
    }
}

fn store_command<R: serde::Serialize + std::fmt::Display>(
    json: bool,
    r: Result<R, coordinator::store::backup::BackupError>,
) -> ExitCode {
    match r {
        Ok(report) => print_report(json, &report),
        Err(e) => {
            eprintln!("coordinator: {e}");
            if e.is_bad_input() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// A command's report on stdout, as JSON or as its sentence; exit 0.
fn print_report<R: serde::Serialize + std::fmt::Display>(json: bool, report: &R) -> ExitCode {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("coordinator: {e}"),
        }
    } else {
        println!("{report}");
    }
    ExitCode::SUCCESS
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("coordinator: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// `coordinator renew-identity`: exit 0; 64 on SQLite or a bad `[store]`; 75 while a leader
/// key is there; 1 when etcd fails.
fn renew_identity(config: &Config, json: bool) -> ExitCode {
    use coordinator::ha::renew::{RenewError, renew_identity};
    use coordinator::store::etcd::{EtcdSettings, EtcdStore};
    if config.store.backend != coordinator::store::config::Backend::Etcd {
        eprintln!(
            "coordinator: renew-identity is for an etcd store ([store] backend = \"etcd\"); \
             on SQLite, `coordinator restore --from BACKUP` gives the restored database a new \
             identity"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let settings = match EtcdSettings::configured(&config.store) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("coordinator: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let r = rt.block_on(async {
        let store = EtcdStore::connect(settings).await?;
        renew_identity(&store).await
    });
    match r {
        Ok(renewed) => print_report(json, &renewed),
        Err(e) => {
            eprintln!("coordinator: {e}");
            match e {
                RenewError::Led { .. } => ExitCode::from(75),
                RenewError::Etcd(e) if e.is_config() => ExitCode::from(EXIT_CONFIG),
                RenewError::Etcd(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// `coordinator migrate`: the copy, with progress on stderr and the report on stdout; exit
/// 0, 64 for bad input (no such file, a non-empty or wrongly configured target), 1 for
/// anything else (a coordinator holding the file, etcd failing halfway).
fn migrate(config: &Config, from: &std::path::Path, json: bool) -> ExitCode {
    use coordinator::store::migrate;
    let target = match migrate::target_settings(&config.store) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("coordinator: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // Progress: every thousandth item of a long area, so a copy of 10,000 entries shows it
    // moves without flooding a terminal.
    let progress = |area: &'static str, done: u64, of: u64| {
        if done > 0 && done.is_multiple_of(1000) {
            eprintln!("coordinator migrate: {area}: {done} of {of}");
        }
    };
    let r = rt.block_on(migrate::migrate(from, target, &progress));
    match r {
        Ok(report) => print_report(json, &report),
        Err(e) => {
            eprintln!("coordinator: {e}");
            if e.is_bad_input() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Pings systemd's watchdog at half its period while the runtime runs and the fleet
/// registry's lock can be taken (a wedged registry stops the pings and systemd restarts us);
/// a standby, which has no registry, while the runtime runs.
async fn watchdog(period: std::time::Duration, loaded: Loaded, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(period / 2);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Some(fleet) = loaded.fleet.get() {
            let _ = fleet.counts_by_state();
        }
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
    }
}

async fn wait_for_signal(shutdown: CancellationToken, loaded: Loaded) {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int, mut hup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(t), Ok(i), Ok(h)) => (t, i, h),
        _ => {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            return;
        }
    };
    let which = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => match loaded.tls.get().map(|tls| tls.reload()) {
                None => tracing::warn!(
                    "SIGHUP: this coordinator does not lead yet and has not loaded its parts; restart it to apply renewed TLS files"
                ),
                Some(r) => match r {
                Ok(_) => tracing::info!(
                    "SIGHUP: TLS files reloaded; new connections use them (the configuration is not read again: restart to apply a change to it)"
                ),
                Err(e) => tracing::error!(
                    error = %e,
                    "SIGHUP: reload refused; keeping the running certificate"
                ),
                },
            },
        }
    };
    tracing::info!(signal = which, "stopping");
    shutdown.cancel();
}
