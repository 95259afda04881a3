//! One tracing initialisation for every Fleetmend binary, and what every binary's `main`
//! shares about the terminal.
//!
//! `FLEETMEND_LOG` takes an `EnvFilter` directive (default `info`) with the `telemetry`
//! feature; with `telemetry-levels` alone (node-agent) a level or a `target=level` list such
//! as `info,node_agent=debug` (tracing-subscriber's `Targets`: the documented forms, without
//! span or field filters, and without regex in the binary);
//! `FLEETMEND_LOG_FORMAT` is `plain` (default) or `json`. Logs go to stderr so that
//! stdout stays free for command output. Plain logs are coloured only when stderr is a
//! terminal and `NO_COLOR` is unset or empty (<https://no-color.org>): a journal or a
//! redirected file gets no escape codes.
//!
//! [`quiet_broken_pipe`] makes `coordinatorctl … | head` end quietly instead of panicking,
//! with the status [`set_broken_pipe_exit`] chose (0 unless a command said otherwise).

use std::fmt;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(feature = "telemetry")]
use tracing_subscriber::EnvFilter;
#[cfg(not(feature = "telemetry"))]
use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Why telemetry could not be initialised.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `FLEETMEND_LOG_FORMAT` has an unknown value.
    #[error("FLEETMEND_LOG_FORMAT={0:?} is not valid: use plain or json")]
    BadFormat(String),
    /// `FLEETMEND_LOG` is not a valid filter.
    #[error("FLEETMEND_LOG is not a valid filter: {0}")]
    BadFilter(String),
}

/// Whether plain logs get ANSI colours: only on a terminal, and never with `NO_COLOR` set to
/// a non-empty value.
pub fn use_colour(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// `FLEETMEND_LOG` and the format `FLEETMEND_LOG_FORMAT` names.
fn from_env() -> Result<(Option<String>, Format), TelemetryError> {
    let directive = std::env::var("FLEETMEND_LOG").ok();
    let format = match std::env::var("FLEETMEND_LOG_FORMAT").as_deref() {
        Err(_) | Ok("") | Ok("plain") => Format::Plain,
        Ok("json") => Format::Json,
        Ok(other) => return Err(TelemetryError::BadFormat(other.to_string())),
    };
    Ok((directive, format))
}

/// What [`init`] would refuse in the environment, without installing anything: for a
/// `check` command, which must fail where the daemon's start would.
pub fn check_env() -> Result<(), TelemetryError> {
    let (directive, _) = from_env()?;
    match directive {
        Some(d) => parse_filter(&d),
        None => Ok(()),
    }
}

#[cfg(feature = "telemetry")]
fn parse_filter(directive: &str) -> Result<(), TelemetryError> {
    EnvFilter::try_new(directive)
        .map(drop)
        .map_err(|e| TelemetryError::BadFilter(e.to_string()))
}

#[cfg(not(feature = "telemetry"))]
fn parse_filter(directive: &str) -> Result<(), TelemetryError> {
    targets(directive).map(drop)
}

/// Installs the global subscriber from the environment. `default` is used when
/// `FLEETMEND_LOG` is unset.
pub fn init(default: &str) -> Result<(), TelemetryError> {
    let (directive, format) = from_env()?;
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    install(directive.as_deref(), default, format, colour)
}

/// Installs the subscriber with the full `EnvFilter`.
#[cfg(feature = "telemetry")]
fn install(
    directive: Option<&str>,
    default: &str,
    format: Format,
    colour: bool,
) -> Result<(), TelemetryError> {
    let filter = match directive {
        Some(s) => EnvFilter::try_new(s).map_err(|e| TelemetryError::BadFilter(e.to_string()))?,
        None => EnvFilter::new(default),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        // A log line that cannot be written (the journal restarting, a reader gone) is
        // dropped. Said on stderr, it would be a second failed write, which `eprintln!`
        // turns into a panic: a daemon must not stop for its log.
        .log_internal_errors(false);
    // A second init (e.g. in tests) is not an error worth failing for.
    let _ = match format {
        Format::Plain => builder.try_init(),
        Format::Json => builder.json().try_init(),
    };
    Ok(())
}

/// Parses a level or `target=level` list (the `telemetry-levels` filter).
#[cfg(not(feature = "telemetry"))]
fn targets(directive: &str) -> Result<Targets, TelemetryError> {
    directive
        .parse()
        .map_err(|e: tracing_subscriber::filter::ParseError| {
            TelemetryError::BadFilter(e.to_string())
        })
}

/// Installs the subscriber with the level/target filter.
#[cfg(not(feature = "telemetry"))]
fn install(
    directive: Option<&str>,
    default: &str,
    format: Format,
    colour: bool,
) -> Result<(), TelemetryError> {
    let filter = targets(directive.unwrap_or(default))?;
    let builder = tracing_subscriber::fmt()
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        // As above: a log line that cannot be written is dropped, not a panic.
        .log_internal_errors(false);
    // A second init (e.g. in tests) is not an error worth failing for.
    let _ = match format {
        Format::Plain => builder.finish().with(filter).try_init(),
        Format::Json => builder.json().finish().with(filter).try_init(),
    };
    Ok(())
}

/// The status a closed stdout ends the program with (see [`set_broken_pipe_exit`]).
static BROKEN_PIPE_EXIT: AtomicU8 = AtomicU8::new(0);

/// Sets the status [`quiet_broken_pipe`] exits with when stdout is closed: a command that
/// already knows it will fail (a `check` that found a failing check) sets its failure status
/// before printing, so `… check | head -1` still fails. 0 until set.
pub fn set_broken_pipe_exit(code: u8) {
    BROKEN_PIPE_EXIT.store(code, Ordering::SeqCst);
}

/// The status to exit with for a panic saying `msg`: `Some` (the one set with
/// [`set_broken_pipe_exit`]) for the broken-pipe panic, `None` for any other panic.
fn broken_pipe_exit(msg: &str) -> Option<i32> {
    is_broken_pipe_panic(msg).then(|| i32::from(BROKEN_PIPE_EXIT.load(Ordering::SeqCst)))
}

/// Makes writing to a closed stdout (`… | head`) end the program quietly, with status 0 or
/// the one set by [`set_broken_pipe_exit`], instead of a "failed printing to stdout: Broken
/// pipe" panic, as `cat` or `grep` would stop. Rust ignores SIGPIPE, so `println!` panics on
/// EPIPE; this panic hook recognises that one panic and exits, and leaves every other panic
/// to the default hook. Call it first thing in `main`.
pub fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(code) = broken_pipe_exit(msg) {
            std::process::exit(code);
        }
        default(info);
    }));
}

/// Whether a panic message is the standard library's for printing to a closed pipe.
fn is_broken_pipe_panic(msg: &str) -> bool {
    msg.starts_with("failed printing to std")
        && (msg.contains("Broken pipe") || msg.contains("os error 32"))
}

/// A log field that prints an optional value as the value, or `none`: use it as
/// `http = %OrNone(&addr)` instead of `?addr`, which would print `Some(…)`.
#[derive(Debug, Clone, Copy)]
pub struct OrNone<'a, T>(pub &'a Option<T>);

impl<T: fmt::Display> fmt::Display for OrNone<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("none"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
    }

    #[test]
    fn broken_pipe_panics_are_recognised_and_others_are_not() {
        assert!(is_broken_pipe_panic(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!is_broken_pipe_panic(
            "failed printing to stdout: disk full"
        ));
        assert!(!is_broken_pipe_panic("index out of bounds"));
    }

    /// The only test touching the process-wide status.
    #[test]
    fn a_closed_stdout_exits_with_the_status_set_and_zero_before() {
        let pipe = "failed printing to stdout: Broken pipe (os error 32)";
        assert_eq!(broken_pipe_exit(pipe), Some(0), "0 until a command sets it");
        set_broken_pipe_exit(1);
        assert_eq!(broken_pipe_exit(pipe), Some(1));
        assert_eq!(broken_pipe_exit("index out of bounds"), None);
        set_broken_pipe_exit(0);
        assert_eq!(broken_pipe_exit(pipe), Some(0));
    }

    #[cfg(not(feature = "telemetry"))]
    #[test]
    fn level_filter_takes_the_documented_forms() {
        use tracing::Level;
        let f = targets("warn").unwrap();
        assert!(f.would_enable("node_agent::agent", &Level::WARN));
        assert!(!f.would_enable("node_agent::agent", &Level::INFO));
        let f = targets("info,node_agent::checks=debug,quinn=off").unwrap();
        assert!(f.would_enable("node_agent::checks::disk", &Level::DEBUG));
        assert!(!f.would_enable("node_agent::agent", &Level::DEBUG));
        assert!(f.would_enable("node_agent::agent", &Level::INFO));
        assert!(!f.would_enable("quinn::connection", &Level::ERROR));
        assert!(targets("node_agent=debug").is_ok());
        assert!(matches!(
            targets("info,=loud"),
            Err(TelemetryError::BadFilter(_))
        ));
        assert!(targets("node_agent=loud").is_err());
    }

    #[test]
    fn optional_fields_print_as_values() {
        let some: Option<u16> = Some(7443);
        let none: Option<u16> = None;
        assert_eq!(OrNone(&some).to_string(), "7443");
        assert_eq!(OrNone(&none).to_string(), "none");
    }
}
