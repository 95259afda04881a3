//! The admin API client: one QUIC connection with an admin certificate, one bidirectional
//! stream per request, each under a time limit (`--timeout`). A request that times out may
//! or may not have been carried out; the error says so and how to find out.
//!
//! Connection settings come from [`ConnectArgs::resolve`]: flags, then `FLEETMEND_CTL_*`
//! variables, then the profile (see [`super::profile`]); an error caused by a setting names
//! where it came from. Client-side failures say what the client can tell: a certificate the
//! coordinator rejected, or nothing answering at the address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use protocol::Role;
use protocol::admin::{AdminRequest, AdminResponse};
use protocol::frame::MAX_ADMIN_FRAME_LEN;
use protocol::messages::{AdminHello, HelloBody};
use protocol::transport::{
    TlsFiles, TlsMaterial, TransportError, connect_within, expect_msg, write_msg,
};

use super::profile::{Origin, Profile, ProfileFile, ProfilePath, Sourced};

/// How long a request may take by default. A coordinator answers in milliseconds; one whose
/// store is stuck should not hang a script forever, and 30 s outlasts any queue commit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach the coordinator: flags, else `FLEETMEND_CTL_*` variables, else the profile.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectArgs {
    /// Connection profile (TOML: server, server_name, ca, cert, key, timeout) [default:
    /// ~/.config/fleetmend/coordinatorctl.toml, if present].
    #[arg(long, env = protocol::env_var!(CTL, "PROFILE"), global = true)]
    pub profile: Option<PathBuf>,
    /// Coordinator QUIC address, `host:port`; several, comma-separated, are tried in order
    /// until one answers.
    #[arg(long, env = protocol::env_var!(CTL, "SERVER"), global = true)]
    pub server: Option<String>,
    /// Name the coordinator's certificate must carry (default: the host part of --server).
    #[arg(long, env = protocol::env_var!(CTL, "SERVER_NAME"), global = true)]
    pub server_name: Option<String>,
    /// Fleet CA certificate (PEM).
    #[arg(long, env = protocol::env_var!(CTL, "CA"), global = true)]
    pub ca: Option<PathBuf>,
    /// Admin certificate (PEM).
    #[arg(long, env = protocol::env_var!(CTL, "CERT"), global = true)]
    pub cert: Option<PathBuf>,
    /// Admin private key (PEM).
    #[arg(long, env = protocol::env_var!(CTL, "KEY"), global = true)]
    pub key: Option<PathBuf>,
    /// Time limit for connecting and for each request (`30s`, `2m`; else `timeout` in the
    /// profile). A request that runs out of time may still be carried out by the coordinator.
    #[arg(long, env = protocol::env_var!(CTL, "TIMEOUT"), global = true, default_value = "30s",
          value_parser = crate::duration::limit)]
    pub timeout: Duration,
    /// Which of the settings above came from the environment rather than a flag (filled
    /// by [`ConnectArgs::note_sources`]; empty means "from flags").
    #[arg(skip)]
    pub from_env: Vec<&'static str>,
    /// Whether --timeout or its variable was given (else the profile's `timeout` applies).
    #[arg(skip)]
    pub timeout_given: bool,
}

impl Default for ConnectArgs {
    fn default() -> Self {
        Self {
            profile: None,
            server: None,
            server_name: None,
            ca: None,
            cert: None,
            key: None,
            timeout: DEFAULT_TIMEOUT,
            from_env: Vec::new(),
            timeout_given: false,
        }
    }
}

/// The connection settings: (argument id, flag, environment variable).
const SETTINGS: &[(&str, &str, &str)] = &[
    ("server", "--server", protocol::env_var!(CTL, "SERVER")),
    (
        "server_name",
        "--server-name",
        protocol::env_var!(CTL, "SERVER_NAME"),
    ),
    ("ca", "--ca", protocol::env_var!(CTL, "CA")),
    ("cert", "--cert", protocol::env_var!(CTL, "CERT")),
    ("key", "--key", protocol::env_var!(CTL, "KEY")),
];

/// Every connection option clap may read from the environment: (flag, variable).
const FROM_ENVIRONMENT: &[(&str, &str)] = &[
    ("--profile", protocol::env_var!(CTL, "PROFILE")),
    ("--server", protocol::env_var!(CTL, "SERVER")),
    ("--server-name", protocol::env_var!(CTL, "SERVER_NAME")),
    ("--ca", protocol::env_var!(CTL, "CA")),
    ("--cert", protocol::env_var!(CTL, "CERT")),
    ("--key", protocol::env_var!(CTL, "KEY")),
    ("--timeout", protocol::env_var!(CTL, "TIMEOUT")),
];

/// clap's error for a bad value names the flag (`invalid value '5' for '--timeout
/// <TIMEOUT>'`) even when the flag was not typed and clap took the value from the flag's
/// environment variable. This names the variable instead, as errors of the settings resolved
/// later do; `typed` is the command line. Any other error, or one about a flag that was
/// typed, comes back unchanged.
pub fn blame_environment(e: clap::Error, typed: &[std::ffi::OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return e;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    // `--timeout <TIMEOUT>`
    let flag = arg.split(' ').next().unwrap_or_default();
    let Some((_, var)) = FROM_ENVIRONMENT.iter().find(|(f, _)| *f == flag) else {
        return e;
    };
    let was_typed = typed.iter().any(|a| {
        a.to_str()
            .is_some_and(|a| a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
    });
    if was_typed {
        return e;
    }
    let value = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => v.clone(),
        _ => String::new(),
    };
    let why = std::error::Error::source(&e)
        .map(|s| format!(": {s}"))
        .unwrap_or_default();
    clap::Error::raw(
        e.kind(),
        format!(
            "invalid value '{value}' in the environment variable {var} (read for {flag}, which was not given){why}\n\nFor more information, try '--help'.\n"
        ),
    )
}

/// Connection settings after merging flags, environment and profile.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// `host:port`, one or more, tried in order.
    pub server: Sourced<Vec<String>>,
    /// TLS server name, if set.
    pub server_name: Option<Sourced<String>>,
    /// Fleet CA.
    pub ca: Sourced<PathBuf>,
    /// Admin certificate.
    pub cert: Sourced<PathBuf>,
    /// Admin key.
    pub key: Sourced<PathBuf>,
    /// Time limit for connecting and for each request.
    pub timeout: Duration,
}

impl ConnectArgs {
    /// Records which settings clap took from the environment, so errors can name the
    /// variable instead of the flag.
    pub fn note_sources(&mut self, matches: &clap::ArgMatches) {
        self.from_env = SETTINGS
            .iter()
            .filter(|(id, _, _)| {
                matches.value_source(id) == Some(clap::parser::ValueSource::EnvVariable)
            })
            .map(|(id, _, _)| *id)
            .collect();
        self.timeout_given =
            matches.value_source("timeout") != Some(clap::parser::ValueSource::DefaultValue);
    }

    fn origin(&self, id: &'static str) -> Origin {
        let (flag, env) = SETTINGS
            .iter()
            .find(|(i, _, _)| *i == id)
            .map(|(_, f, e)| (*f, *e))
            .unwrap_or(("?", "?"));
        if self.from_env.contains(&id) {
            Origin::Env(env)
        } else {
            Origin::Flag(flag)
        }
    }

    fn pick<T: Clone>(
        &self,
        id: &'static str,
        flag: &Option<T>,
        profile: &Profile,
        from_profile: impl Fn(&ProfileFile) -> &Option<T>,
    ) -> Option<Sourced<T>> {
        match flag {
            Some(v) => Some(Sourced {
                value: v.clone(),
                from: self.origin(id),
            }),
            None => profile.get(id, from_profile),
        }
    }

    /// Merges flags and environment over the profile; every missing setting is reported
    /// in one error that says how to set it.
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        let which = ProfilePath::choose(
            self.profile.as_deref(),
            std::env::var("XDG_CONFIG_HOME").ok().as_deref(),
            std::env::var("HOME").ok().as_deref(),
        );
        let profile = Profile::load(&which)?;
        let server = match &self.server {
            Some(v) => Some(Sourced {
                value: v.split(',').map(|s| s.trim().to_string()).collect(),
                from: self.origin("server"),
            }),
            None => profile.get("server", |f| &f.server).map(|s| Sourced {
                value: s.value.list(),
                from: s.from,
            }),
        };
        if let Some(s) = &server
            && (s.value.is_empty() || s.value.iter().any(|a| a.is_empty()))
        {
            bail!(
                "server (from {}) names no address: give host:port, or several (comma-separated, or a list in the profile)",
                s.from
            );
        }
        let timeout = match profile.get("timeout", |f| &f.timeout) {
            Some(t) if !self.timeout_given => crate::duration::limit(&t.value)
                .map_err(|e| anyhow!("timeout (from {}): {e}", t.from))?,
            _ => self.timeout,
        };
        let server_name = self.pick("server_name", &self.server_name, &profile, |f| {
            &f.server_name
        });
        let ca = self.pick("ca", &self.ca, &profile, |f| &f.ca);
        let cert = self.pick("cert", &self.cert, &profile, |f| &f.cert);
        let key = self.pick("key", &self.key, &profile, |f| &f.key);
        match (server, ca, cert, key) {
            (Some(server), Some(ca), Some(cert), Some(key)) => Ok(Resolved {
                server,
                server_name,
                ca,
                cert,
                key,
                timeout,
            }),
            (server, ca, cert, key) => {
                let missing: Vec<&str> = [
                    ("server", server.is_none()),
                    ("ca", ca.is_none()),
                    ("cert", cert.is_none()),
                    ("key", key.is_none()),
                ]
                .into_iter()
                .filter(|(_, m)| *m)
                .map(|(k, _)| k)
                .collect();
                bail!("{}", missing_message(&missing, &which))
            }
        }
    }
}

/// The error for missing connection settings: every one of them, and the three ways to set
/// each.
fn missing_message(missing: &[&str], which: &ProfilePath) -> String {
    let how: Vec<String> = missing
        .iter()
        .map(|k| {
            let (_, flag, env) = SETTINGS
                .iter()
                .find(|(i, _, _)| i == k)
                .copied()
                .unwrap_or((k, k, k));
            format!("  {k}: flag {flag}, environment variable {env}, or `{k}` in the profile")
        })
        .collect();
    let profile = match which {
        ProfilePath::Explicit(p) => format!("the profile is {}", p.display()),
        ProfilePath::Default(p) if p.exists() => format!("the profile is {}", p.display()),
        ProfilePath::Default(p) => format!(
            "no profile at {} (the default; --profile or FLEETMEND_CTL_PROFILE names another)",
            p.display()
        ),
        ProfilePath::None => {
            "no profile (no HOME to find ~/.config/fleetmend/coordinatorctl.toml)".to_string()
        }
    };
    format!(
        "this command talks to the coordinator, but {} connection setting{} not set:\n{}\n{profile}; `coordinatorctl pki issue --role admin --out DIR` prints a profile to put there",
        missing.len(),
        if missing.len() == 1 { " is" } else { "s are" },
        how.join("\n"),
    )
}

/// A connected admin session.
#[derive(Debug)]
pub struct AdminClient {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
    timeout: Duration,
}

/// Splits `host:port` into its host part (brackets removed) for the TLS server name.
fn host_part(server: &str) -> &str {
    let host = server.rsplit_once(':').map(|(h, _)| h).unwrap_or(server);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Loads the admin TLS files; an error names each file with where its path came from.
fn load_tls(r: &Resolved) -> anyhow::Result<TlsMaterial> {
    for (what, f) in [("ca", &r.ca), ("cert", &r.cert), ("key", &r.key)] {
        if let Err(e) = std::fs::metadata(&f.value) {
            bail!(
                "{what} {} (from {}): cannot read it: {e}",
                f.value.display(),
                f.from
            );
        }
    }
    let files = TlsFiles {
        ca: r.ca.value.clone(),
        cert: r.cert.value.clone(),
        key: r.key.value.clone(),
    };
    TlsMaterial::load(&files).with_context(|| {
        format!(
            "cannot use the admin TLS files (ca from {}, cert from {}, key from {})",
            r.ca.from, r.cert.from, r.key.from
        )
    })
}

/// Says on stderr, once per run, when the admin certificate or the CA expires within a month
/// (or has expired): past it the coordinator refuses this certificate.
fn warn_if_expiring(tls: &TlsMaterial, r: &Resolved) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let now = protocol::transport::unix_now();
    if let Some(w) = tls.expiry().warning(now)
        && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        eprintln!(
            "coordinatorctl: {w} ({}, from {}); issue a new one with `coordinatorctl pki issue --role admin --name {}`",
            r.cert.value.display(),
            r.cert.from,
            tls.identity().name
        );
    }
}

/// The answer inside a [`AdminResponse::StoreFailing`], saying on stderr that the
/// coordinator's database writes fail, when that starts and when it ends (a `--follow` run
/// may see both).
fn store_said(r: AdminResponse) -> AdminResponse {
    static FAILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let (answer, reason) = match r {
        AdminResponse::StoreFailing { reason, answer } => (*answer, Some(reason)),
        other => (other, None),
    };
    let was = FAILING.swap(reason.is_some(), std::sync::atomic::Ordering::Relaxed);
    match reason {
        Some(why) if !was => eprintln!("{}", store_failing_warning(&why)),
        None if was => eprintln!("coordinatorctl: the coordinator's database writes work again"),
        _ => {}
    }
    answer
}

fn store_failing_warning(why: &str) -> String {
    format!(
        "coordinatorctl: WARNING: the coordinator cannot write its database ({why}). What it \
         shows is as last written: a state it could not store is not shown (a machine that \
         died may still read healthy), changes are refused, and repairs wait. Free the space \
         or fix the disk; it catches up by itself (its log, /healthz)"
    )
}

impl AdminClient {
    /// Connects and completes the admin hello, with the first server of the list that
    /// answers (several coordinators: tried in order, each within the time limit). A
    /// coordinator that does not lead names the leader, and the leader is tried next at once
    /// (once: two standbys naming each other cannot keep it), or the next server when it
    /// knows none.
    pub async fn connect(args: &ConnectArgs) -> anyhow::Result<Self> {
        let r = args.resolve()?;
        let tls = load_tls(&r)?;
        warn_if_expiring(&tls, &r);
        let mut failed = Vec::new();
        let mut queue: std::collections::VecDeque<String> =
            r.server.value.iter().cloned().collect();
        let mut redirected = false;
        while let Some(server) = queue.pop_front() {
            match Self::connect_to(&r, &tls, &server).await {
                Ok(c) => {
                    if !failed.is_empty() {
                        eprintln!("coordinatorctl: {}; using {server}", failed.join("; "));
                    }
                    return Ok(c);
                }
                Err(e) => {
                    let leader = match e.downcast_ref::<TransportError>() {
                        Some(TransportError::Standby { leader, .. }) => leader.clone(),
                        _ => None,
                    };
                    match leader.filter(|_| !redirected) {
                        Some(leader) => {
                            redirected = true;
                            failed.push(format!("{server} does not lead ({e:#})"));
                            queue.push_front(leader);
                        }
                        None if r.server.value.len() == 1 && failed.is_empty() => return Err(e),
                        None => failed.push(format!("{server} did not answer ({e:#})")),
                    }
                }
            }
        }
        bail!(
            "no coordinator answered; tried in order (server from {}), each within {} (--timeout):\n  {}",
            r.server.from,
            protocol::duration::display(r.timeout),
            failed.join("\n  ")
        )
    }

    /// Connects to every server of the list, each on its own (no redirect to a leader): the
    /// servers with what each answered, for `coordinatorctl status`.
    pub async fn connect_each(
        args: &ConnectArgs,
    ) -> anyhow::Result<Vec<(String, anyhow::Result<Self>)>> {
        let r = args.resolve()?;
        let tls = load_tls(&r)?;
        warn_if_expiring(&tls, &r);
        let mut out = Vec::new();
        for server in &r.server.value {
            out.push((server.clone(), Self::connect_to(&r, &tls, server).await));
        }
        Ok(out)
    }

    /// Connects to `server`, one of the resolved servers.
    async fn connect_to(r: &Resolved, tls: &TlsMaterial, server: &str) -> anyhow::Result<Self> {
        let addr: SocketAddr = tokio::net::lookup_host(server)
            .await
            .with_context(|| {
                format!(
                    "cannot resolve server {server} (from {}); expected host:port",
                    r.server.from
                )
            })?
            .next()
            .ok_or_else(|| {
                anyhow!(
                    "server {server} (from {}) resolves to no address",
                    r.server.from
                )
            })?;
        let name = r
            .server_name
            .as_ref()
            .map(|n| n.value.clone())
            .unwrap_or_else(|| host_part(server).to_string());
        let endpoint = tls.client_endpoint(addr)?;
        let hello = HelloBody::Admin(AdminHello {
            client: format!("coordinatorctl {}", env!("CARGO_PKG_VERSION")),
        });
        let connect = connect_within(&endpoint, addr, &name, Role::Coordinator, hello, r.timeout);
        let session = connect.await.map_err(|e| match e {
            TransportError::NothingListens { .. } => anyhow!(
                "nothing listens on {addr} (UDP): the host answered \"port unreachable\" (server \
                 from {}); is the coordinator running, and is this its QUIC port? Nothing was sent",
                r.server.from
            ),
            TransportError::CertificateRejected { dates: true, .. } => anyhow!(
                "{e}; the certificate is {} (from {})",
                r.cert.value.display(),
                r.cert.from
            ),
            TransportError::CertificateRejected { .. } => anyhow!(
                "{e}; the certificate is {} (from {}): is it issued by the coordinator's CA and not expired?",
                r.cert.value.display(),
                r.cert.from
            ),
            TransportError::ServerCertificateRefused { .. } => anyhow!(
                "{e}; the CA is {} (from {}), the server name {name:?}",
                r.ca.value.display(),
                r.ca.from
            ),
            TransportError::NoAnswer { .. } => {
                anyhow!("{e} (server from {}, --timeout {:?}); nothing was sent", r.server.from, r.timeout)
            }
            TransportError::Timeout(_) => anyhow!(
                "no admin session with {server} within {:?} (--timeout); nothing was sent",
                r.timeout
            ),
            e => anyhow::Error::new(e).context(format!("cannot open an admin session with {server}")),
        })?;
        Ok(Self {
            endpoint,
            conn: session.conn,
            timeout: r.timeout,
        })
    }

    /// Sends one request and returns the answer; an `Error` answer is returned as is. No
    /// answer within the time limit is an error saying the outcome is unknown.
    pub async fn request_raw(&self, req: &AdminRequest) -> anyhow::Result<AdminResponse> {
        let exchange = async {
            let (mut send, mut recv) = self.conn.open_bi().await?;
            write_msg(&mut send, req, MAX_ADMIN_FRAME_LEN).await?;
            send.finish()?;
            Ok::<_, anyhow::Error>(
                expect_msg::<AdminResponse>(&mut recv, MAX_ADMIN_FRAME_LEN).await?,
            )
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Err(NoAnswer(timed_out(req, self.timeout)).into()),
            Ok(Err(e)) => match self.lost() {
                Some(why) => Err(anyhow!(
                    "the connection to the coordinator ended ({why}); the request may or may not \
                     have been carried out: look before running it again"
                )),
                None => Err(e),
            },
            Ok(Ok(r)) => Ok(store_said(r)),
        }
    }

    /// Why the connection ended, for a person; `None` while it is open.
    pub fn lost(&self) -> Option<String> {
        self.conn.close_reason().map(|e| match e {
            quinn::ConnectionError::ApplicationClosed(c) if !c.reason.is_empty() => {
                format!(
                    "the coordinator said: {}",
                    String::from_utf8_lossy(&c.reason)
                )
            }
            quinn::ConnectionError::ApplicationClosed(c) => {
                format!("closed by the coordinator, code {}", c.error_code)
            }
            quinn::ConnectionError::Reset => "reset: the coordinator restarted".to_string(),
            e => e.to_string(),
        })
    }

    /// Sends one request; an `Error` answer becomes an error carrying its reason.
    pub async fn request(&self, req: &AdminRequest) -> anyhow::Result<AdminResponse> {
        match self.request_raw(req).await? {
            AdminResponse::Error(r) => Err(refused(&r)),
            other => Ok(other),
        }
    }

    /// Closes the connection politely.
    pub async fn close(self) {
        self.conn.close(0u32.into(), b"done");
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.endpoint.wait_idle())
            .await;
    }
}

/// A request that got no answer within `--timeout` (the message says what that means for
/// it). Commands that only read and poll ([`super::common::Polling`]) ask again instead.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoAnswer(String);

/// The error for a request that got no answer in time: what may have happened and how to
/// find out before retrying.
fn timed_out(req: &AdminRequest, timeout: Duration) -> String {
    let check = match req {
        AdminRequest::Machines(_) => "coordinatorctl machines list",
        AdminRequest::RepairQueue(_) => "coordinatorctl repair-queue list",
        AdminRequest::Diagnostics(_) => "coordinatorctl diagnostics list ADDRESS",
        AdminRequest::Remediation(_) => "coordinatorctl remediation status",
        AdminRequest::Fence(_) => "coordinatorctl fence list",
        AdminRequest::Status => "coordinatorctl status",
    };
    format!(
        "no answer from the coordinator within {timeout:?} (--timeout): the outcome is unknown, the request may or may not have been carried out; check with `{check}` before retrying, and the coordinator's /healthz and log for why it is slow"
    )
}

/// A coordinator's refusal, for a person. A request the coordinator could not decode is
/// most often one its release does not know (a coordinatorctl newer than the coordinator,
/// mid-upgrade): say so, rather than only the decoder's words.
pub fn refused(r: &protocol::messages::Refusal) -> anyhow::Error {
    if r.code == protocol::messages::RefusalCode::Malformed {
        anyhow!(
            "coordinator refused the request: {}; a coordinator of an older release than this \
             coordinatorctl ({}) cannot read requests added since: upgrade the coordinator, or \
             use a coordinatorctl of its release",
            r.reason,
            env!("CARGO_PKG_VERSION")
        )
    } else {
        anyhow!("coordinator refused the request: {}", r.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_the_coordinator_cannot_decode_suggests_an_older_coordinator() {
        use protocol::messages::{Refusal, RefusalCode};
        let r = Refusal::new(RefusalCode::Malformed, "admin request: undecodable frame");
        let e = refused(&r).to_string();
        assert!(
            e.contains("older release") && e.contains("undecodable"),
            "{e}"
        );
        let r = Refusal::new(RefusalCode::BadRequest, "no such entry");
        assert_eq!(
            refused(&r).to_string(),
            "coordinator refused the request: no such entry"
        );
    }

    #[test]
    fn timeout_message_says_the_outcome_is_unknown_and_how_to_check() {
        let req = AdminRequest::RepairQueue(protocol::admin::repair::RepairQueueRequest::List);
        let msg = timed_out(&req, Duration::from_secs(30));
        assert!(msg.contains("outcome is unknown"), "{msg}");
        assert!(msg.contains("coordinatorctl repair-queue list"), "{msg}");
    }

    #[test]
    fn host_part_handles_ipv6_and_names() {
        assert_eq!(host_part("127.0.0.1:7443"), "127.0.0.1");
        assert_eq!(host_part("[::1]:7443"), "::1");
        assert_eq!(host_part("coord.example:7443"), "coord.example");
    }
}
