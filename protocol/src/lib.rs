//! Fleetmend's wire protocol.
//!
//! This crate holds what every Fleetmend component must agree on:
//! - the message types ([`messages`], [`actions`], [`admin`], [`gateway`]) and the protocol version,
//! - length-delimited framing with a hard size limit ([`frame`]), sans-IO,
//! - identities carried in certificate URI SANs ([`identity`]),
//! - behind the `transport` feature, rustls and quinn configuration builders and async
//!   helpers that move frames over QUIC streams ([`transport`]),
//! - behind the `pki` feature, the fleet certificate authority ([`pki`]),
//! - behind the `telemetry` feature (or `telemetry-levels`, its regex-free filter for the
//!   agent), one tracing initialisation for all binaries ([`telemetry`]),
//! - behind the `http` feature, plain-HTTP serving with a header-read timeout ([`http`]),
//! - reading a certificate, key or password file that refuses a FIFO or a device instead
//!   of hanging on it ([`file`]).
//!
//! The message and framing modules do no I/O: they are tested without sockets. The crate
//! deliberately knows nothing about what the coordinator does with a report.

pub mod actions;
pub mod admin;
pub mod duration;
pub mod fencing;
pub mod file;
pub mod frame;
pub mod gateway;
#[cfg(feature = "http")]
pub mod http;
pub mod identity;
pub mod messages;
#[cfg(feature = "pki")]
pub mod pki;
pub mod process_metrics;
pub mod process_tree;
#[cfg(feature = "telemetry-levels")]
pub mod telemetry;
#[cfg(feature = "transport")]
pub mod transport;

pub use frame::{FrameDecoder, FrameError, decode_payload, encode_frame};
pub use identity::{Identity, IdentityError, Role};

/// The protocol version this build speaks. Bumped on any incompatible change to a message.
///
/// Peers exchange it in the first message of every connection; a peer speaking another
/// version is refused with [`messages::RefusalCode::UnsupportedVersion`] before anything else
/// is decoded.
///
/// 2: power requests and agent actions carry a fencing token ([`fencing`]). A server of this
/// release also accepts a hello of every version down to [`OLDEST_PROTOCOL_VERSION`] and
/// talks that version on the connection ([`transport::Session::version`]); a client of this
/// release refused by an older server says hello again in the oldest version. So an
/// upgrade can still go a part at a time.
pub const PROTOCOL_VERSION: u16 = 2;

/// The oldest protocol version this release still speaks: 1, before fencing tokens.
pub const OLDEST_PROTOCOL_VERSION: u16 = 1;

/// The longest an agent waits between two connection attempts (its reconnect backoff's
/// cap). After its own restart the coordinator gives a machine that reported to its
/// earlier run this much more than the usual grace: the agent may be waiting out a backoff
/// drawn while the coordinator was down.
pub const AGENT_RECONNECT_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// ALPN protocol id for every Fleetmend QUIC connection, so a Fleetmend endpoint never
/// completes a handshake with some other QUIC application by accident.
pub const ALPN: &[u8] = b"fleetmend/1";

/// The environment variable for one setting of one program, so that a variable exported
/// for one program never changes another (`FLEETMEND_CTL_CERT` is `coordinatorctl`'s
/// admin certificate and nothing else): `env_var!(CTL, "CERT")` is `"FLEETMEND_CTL_CERT"`.
/// The four prefixes are `CTL` (`coordinatorctl`), `AGENT` (`node-agent`), `GATEWAY`
/// (`bmc-gateway`) and `COORDINATOR` (`coordinator`); a new setting names its variable
/// through this macro, in clap as `#[arg(env = protocol::env_var!(AGENT, "ROOT"))]`.
/// Only `FLEETMEND_LOG` and `FLEETMEND_LOG_FORMAT` are shared by every program.
#[macro_export]
macro_rules! env_var {
    (CTL, $key:literal) => {
        concat!("FLEETMEND_CTL_", $key)
    };
    (AGENT, $key:literal) => {
        concat!("FLEETMEND_AGENT_", $key)
    };
    (GATEWAY, $key:literal) => {
        concat!("FLEETMEND_GATEWAY_", $key)
    };
    (COORDINATOR, $key:literal) => {
        concat!("FLEETMEND_COORDINATOR_", $key)
    };
}

/// What every Fleetmend binary prints after its name for `--version`: the release and the
/// git commit it was built from ("unknown" outside a git checkout; `FLEETMEND_GIT_COMMIT`
/// at build time overrides it).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (fleetmend, commit ",
    env!("FLEETMEND_GIT_COMMIT"),
    ")"
);
