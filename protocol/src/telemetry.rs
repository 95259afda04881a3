//! One tracing initialisation for every Fleetmend binary.
//!
//! `FLEETMEND_LOG` takes an `EnvFilter` directive (default `info`);
//! `FLEETMEND_LOG_FORMAT` is `plain` (default) or `json`. Logs go to stderr so that
//! stdout stays free for command output.

use tracing_subscriber::EnvFilter;

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

/// Installs the global subscriber from the environment. `default` is used when
/// `FLEETMEND_LOG` is unset.
pub fn init(default: &str) -> Result<(), TelemetryError> {
    let filter = match std::env::var("FLEETMEND_LOG") {
        Ok(s) => EnvFilter::try_new(&s).map_err(|e| TelemetryError::BadFilter(e.to_string()))?,
        Err(_) => EnvFilter::new(default),
    };
    let format = match std::env::var("FLEETMEND_LOG_FORMAT").as_deref() {
        Err(_) | Ok("") | Ok("plain") => Format::Plain,
        Ok("json") => Format::Json,
        Ok(other) => return Err(TelemetryError::BadFormat(other.to_string())),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (e.g. in tests) is not an error worth failing for.
    let _ = match format {
        Format::Plain => builder.try_init(),
        Format::Json => builder.json().try_init(),
    };
    Ok(())
}
