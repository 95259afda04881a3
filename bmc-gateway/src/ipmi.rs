//! [`IpmiPowerControl`]: IPMI 2.0 over LAN (RMCP+, cipher suite 3) on the `ipmi-rs` crate.
//!
//! ipmi-rs 0.6 is blocking, has no chassis commands, no retransmission, no close-session and
//! never raises the session privilege. So each BMC gets a dedicated thread that owns one RMCP+
//! session and reuses it across requests; requests go as raw messages (chassis status NetFn 0x00
//! cmd 0x01, chassis control NetFn 0x00 cmd 0x02); after activation the thread sends Set Session
//! Privilege Level (NetFn 0x06 cmd 0x3B, administrator) because BMCs that enforce privilege
//! answer chassis control with 0xD4 otherwise; lost datagrams are retried; stale replies are
//! skipped; the session is closed (Get Session Info + Close Session) when it is replaced or the
//! gateway stops. This module decides nothing about what an action means.

use std::io::ErrorKind;
use std::net::ToSocketAddrs;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ipmi_rs::connection::{
    IpmiConnection, LogicalUnit, Message, NetFn, Request, RequestTargetAddress,
};
use ipmi_rs::rmcp::{
    ActivationError, Rmcp, RmcpIpmiError, RmcpIpmiReceiveError, V2_0ActivationError,
};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::power::{BmcError, ChassisOp, PowerControl, PowerState};

/// A session idle for longer than this is replaced before use.
///
/// The IPMI specification's default session inactivity timeout is 60 s and a BMC silently drops
/// datagrams for a session it has expired, which would cost a full retry cycle to discover;
/// re-activating a session idle for 45 s costs four round trips and never hits that window.
pub const SESSION_MAX_IDLE: Duration = Duration::from_secs(45);

/// Where and how to reach one IPMI BMC.
#[derive(Debug, Clone)]
pub struct IpmiTarget {
    /// Name for messages, e.g. `10.0.0.5 (ipmi 10.1.0.5:623)`.
    pub name: String,
    /// BMC host.
    pub host: String,
    /// BMC UDP port.
    pub port: u16,
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// Time to wait for one reply datagram.
    pub reply_timeout: Duration,
    /// Sends per request before giving up.
    pub attempts: u32,
}

enum Job {
    Status(oneshot::Sender<Result<PowerState, BmcError>>),
    Chassis(ChassisOp, oneshot::Sender<Result<String, BmcError>>),
    Close(oneshot::Sender<()>),
}

/// IPMI power control for one BMC, backed by a dedicated thread owning the session.
#[derive(Debug)]
pub struct IpmiPowerControl {
    name: String,
    jobs: std::sync::Mutex<std_mpsc::Sender<Job>>,
}

impl IpmiPowerControl {
    /// Starts the BMC's thread. No datagram is sent until the first request.
    pub fn new(target: IpmiTarget) -> Self {
        let (tx, rx) = std_mpsc::channel();
        let name = target.name.clone();
        std::thread::Builder::new()
            .name(format!("ipmi {}", target.host))
            .spawn(move || {
                let mut s = Session::new(target);
                for job in rx {
                    s.run(job);
                }
                s.close();
            })
            .expect("spawn IPMI thread");
        Self {
            name,
            jobs: std::sync::Mutex::new(tx),
        }
    }

    fn submit(&self, job: Job) -> bool {
        self.jobs.lock().expect("not poisoned").send(job).is_ok()
    }

    fn gone(&self) -> BmcError {
        BmcError::Unreachable {
            bmc: self.name.clone(),
            detail: "the IPMI thread for this BMC has stopped".into(),
        }
    }
}

impl PowerControl for IpmiPowerControl {
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            if !self.submit(Job::Status(tx)) {
                return Err(self.gone());
            }
            rx.await.unwrap_or_else(|_| Err(self.gone()))
        })
    }

    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            if !self.submit(Job::Chassis(op, tx)) {
                return Err(self.gone());
            }
            rx.await.unwrap_or_else(|_| Err(self.gone()))
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            if self.submit(Job::Close(tx)) {
                let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
            }
        })
    }
}

/// The chassis control data byte for an operation (IPMI 2.0 table 28-4).
pub fn chassis_control_byte(op: ChassisOp) -> u8 {
    match op {
        ChassisOp::Off => 0x00,
        ChassisOp::On => 0x01,
        ChassisOp::Cycle => 0x02,
        ChassisOp::Reset => 0x03,
        ChassisOp::SoftOff => 0x05,
    }
}

/// Decodes a Get Chassis Status reply's data (after the completion code): bit 0 of the first
/// byte is "power is on".
pub fn parse_chassis_status(data: &[u8]) -> Option<PowerState> {
    data.first().map(|b| {
        if b & 0x01 == 1 {
            PowerState::On
        } else {
            PowerState::Off
        }
    })
}

/// True for the completion codes that mean "busy, ask again later" (IPMI 2.0 table 5-2):
/// 0xC0 node busy (command processing resources temporarily unavailable) and 0xD2 BMC
/// initializing. Not 0xCC (invalid data field) nor 0xD5 (not supported in present state),
/// which asking again does not change.
pub fn is_busy_code(cc: u8) -> bool {
    matches!(cc, 0xC0 | 0xD2)
}

/// Names a completion code for a person.
pub fn completion_code_text(cc: u8) -> &'static str {
    match cc {
        0x00 => "ok",
        0xC0 => "node busy",
        0xC1 => "invalid command",
        0xC3 => "timeout",
        0xC7 => "request data length invalid",
        0xC9 => "parameter out of range",
        0xCC => "invalid data field",
        0xCE => "response could not be provided",
        0xD2 => "BMC initializing",
        0xD4 => "insufficient privilege",
        0xD5 => "not supported in present state",
        0xFF => "unspecified error",
        _ => "error",
    }
}

struct Session {
    t: IpmiTarget,
    rmcp: Option<Rmcp>,
    last_used: Instant,
    /// Whether "IPMI session opened" was said at INFO and no session failed to open since.
    /// Sessions are replaced all the time in a steady state (the idle probe every minute
    /// finds the last one past [`SESSION_MAX_IDLE`]; a cycle or reset gets a fresh one), so
    /// only the first one, and the first after a failure, is an INFO line; the rest are DEBUG.
    said_open: bool,
}

enum Exchange {
    Reply(u8, Vec<u8>),
    /// No (matching) reply after all attempts.
    Timeout,
    /// The session or socket failed; it has been dropped.
    Broken(String),
}

impl Session {
    fn new(t: IpmiTarget) -> Self {
        Self {
            t,
            rmcp: None,
            last_used: Instant::now(),
            said_open: false,
        }
    }

    fn run(&mut self, job: Job) {
        // ipmi-rs unwraps a few socket errors internally; a panic must cost the session, not
        // the thread (and with it every later request to this BMC).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
            Job::Status(tx) => {
                let _ = tx.send(self.status());
            }
            Job::Chassis(op, tx) => {
                let _ = tx.send(self.control(op));
            }
            Job::Close(tx) => {
                self.close();
                let _ = tx.send(());
            }
        }));
        if r.is_err() {
            warn!(bmc = %self.t.name, "IPMI library panicked; dropping the session");
            self.rmcp = None;
        }
    }

    fn timeout_err(&self, what: &str) -> BmcError {
        BmcError::Timeout {
            bmc: self.t.name.clone(),
            what: what.to_string(),
            waited_ms: (self.t.reply_timeout * self.t.attempts).as_millis() as u64,
        }
    }

    fn status(&mut self) -> Result<PowerState, BmcError> {
        let (cc, data) = self.command("chassis status", NetFn::Chassis, 0x01, &[])?;
        if cc != 0 {
            return Err(BmcError::Refused {
                bmc: self.t.name.clone(),
                what: "chassis status".into(),
                detail: format!("completion code 0x{cc:02x} ({})", completion_code_text(cc)),
            });
        }
        parse_chassis_status(&data).ok_or_else(|| BmcError::Protocol {
            bmc: self.t.name.clone(),
            what: "chassis status".into(),
            detail: "empty reply".into(),
        })
    }

    fn control(&mut self, op: ChassisOp) -> Result<String, BmcError> {
        let byte = chassis_control_byte(op);
        let (cc, what) = if repeats_harm(op) {
            // A BMC that is slow to answer (or whose answer is lost) may have done it already:
            // each resend is a new request to it, and a power cycle or reset sent twice runs
            // twice. So it goes once, on a fresh session (an expired one cannot swallow it),
            // and an answer is awaited as long as all the attempts of another command.
            let what = format!(
                "chassis control {} (0x{byte:02x}), sent once (a repeated {} would run twice)",
                op.as_str(),
                op.as_str()
            );
            self.close();
            self.ensure()?;
            match self.exchange_once(NetFn::Chassis, 0x02, &[byte]) {
                Exchange::Reply(cc, _) => (cc, what),
                Exchange::Timeout => {
                    self.rmcp = None;
                    return Err(self.timeout_err(&what));
                }
                Exchange::Broken(detail) => return Err(self.broken(&what, detail)),
            }
        } else {
            let what = format!("chassis control {} (0x{byte:02x})", op.as_str());
            let (cc, _) = self.command(&what, NetFn::Chassis, 0x02, &[byte])?;
            (cc, what)
        };
        if is_busy_code(cc) {
            return Err(BmcError::Busy {
                bmc: self.t.name.clone(),
                what,
                detail: format!("completion code 0x{cc:02x} ({})", completion_code_text(cc)),
            });
        }
        if cc != 0 {
            return Err(BmcError::Refused {
                bmc: self.t.name.clone(),
                what,
                detail: format!("completion code 0x{cc:02x} ({})", completion_code_text(cc)),
            });
        }
        Ok(format!("{what}: completion code 0x00"))
    }

    /// Sends one command on a (re)used session; a reused session that does not answer is
    /// replaced once, since the BMC may have expired it.
    fn command(
        &mut self,
        what: &str,
        netfn: NetFn,
        cmd: u8,
        data: &[u8],
    ) -> Result<(u8, Vec<u8>), BmcError> {
        if self.rmcp.is_some() && self.last_used.elapsed() > SESSION_MAX_IDLE {
            debug!(bmc = %self.t.name, "session idle too long; replacing it");
            self.close();
        }
        let reused = self.rmcp.is_some();
        self.ensure()?;
        match self.exchange(netfn, cmd, data) {
            Exchange::Reply(cc, d) => Ok((cc, d)),
            Exchange::Timeout | Exchange::Broken(_) if reused => {
                info!(bmc = %self.t.name, what, "no answer on the reused session; opening a new one");
                self.rmcp = None;
                self.ensure()?;
                match self.exchange(netfn, cmd, data) {
                    Exchange::Reply(cc, d) => Ok((cc, d)),
                    Exchange::Timeout => {
                        self.rmcp = None;
                        Err(self.timeout_err(what))
                    }
                    Exchange::Broken(detail) => Err(self.broken(what, detail)),
                }
            }
            Exchange::Timeout => {
                self.rmcp = None;
                Err(self.timeout_err(what))
            }
            Exchange::Broken(detail) => Err(self.broken(what, detail)),
        }
    }

    fn broken(&mut self, what: &str, detail: String) -> BmcError {
        self.rmcp = None;
        BmcError::Unreachable {
            bmc: self.t.name.clone(),
            detail: format!("{what}: {detail}"),
        }
    }

    /// One request with retransmissions; replies to other commands (late answers to an earlier
    /// attempt) are skipped.
    fn exchange(&mut self, netfn: NetFn, cmd: u8, data: &[u8]) -> Exchange {
        self.exchange_with(netfn, cmd, data, self.t.attempts, self.t.reply_timeout)
    }

    /// One request sent once, its answer awaited for `attempts` × `reply_timeout`: for
    /// commands that must not run twice.
    fn exchange_once(&mut self, netfn: NetFn, cmd: u8, data: &[u8]) -> Exchange {
        let wait = self.t.reply_timeout * self.t.attempts;
        self.exchange_with(netfn, cmd, data, 1, wait)
    }

    /// Sends the request up to `sends` times, waiting `wait` for its answer after each.
    fn exchange_with(
        &mut self,
        netfn: NetFn,
        cmd: u8,
        data: &[u8],
        sends: u32,
        wait: Duration,
    ) -> Exchange {
        let Some(rmcp) = self.rmcp.as_mut() else {
            return Exchange::Broken("no session".into());
        };
        for attempt in 0..sends {
            let mut req = Request::new(
                Message::new_request(netfn, cmd, data.to_vec()),
                RequestTargetAddress::Bmc(LogicalUnit::Zero),
            );
            if let Err(e) = rmcp.send(&mut req) {
                return Exchange::Broken(format!("send failed: {e:?}"));
            }
            let sent = Instant::now();
            loop {
                match rmcp.recv() {
                    Ok(resp) if resp.netfn() == netfn && resp.cmd() == cmd => {
                        self.last_used = Instant::now();
                        return Exchange::Reply(resp.cc(), resp.data().to_vec());
                    }
                    Ok(other) => {
                        debug!(bmc = %self.t.name, netfn = ?other.netfn(), cmd = other.cmd(), "skipping a stale reply");
                        if sent.elapsed() >= wait {
                            break;
                        }
                    }
                    Err(RmcpIpmiError::Receive(RmcpIpmiReceiveError::Io(e)))
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                    {
                        // The socket's read timeout is one reply_timeout: that is the
                        // whole wait of a resent request; a longer wait (a request sent
                        // once) goes on reading until it is nearly over.
                        if sends > 1 || sent.elapsed() + READ_SLACK >= wait {
                            debug!(bmc = %self.t.name, attempt, "no reply in time");
                            break;
                        }
                    }
                    Err(RmcpIpmiError::Receive(RmcpIpmiReceiveError::Io(e))) => {
                        return Exchange::Broken(format!("receive failed: {e}"));
                    }
                    Err(e) => {
                        // A datagram we cannot decode (another session's, garbage): skip it.
                        debug!(bmc = %self.t.name, error = ?e, "skipping an undecodable datagram");
                        if sent.elapsed() >= wait {
                            break;
                        }
                    }
                }
            }
        }
        Exchange::Timeout
    }

    /// Opens a session when there is none: RMCP presence ping, RMCP+ open session and RAKP
    /// (inside ipmi-rs), then Set Session Privilege Level to administrator.
    fn ensure(&mut self) -> Result<(), BmcError> {
        if self.rmcp.is_some() {
            return Ok(());
        }
        let r = self.open();
        if r.is_err() {
            self.said_open = false;
        }
        r
    }

    /// [`Session::ensure`]'s work when there is no session.
    fn open(&mut self) -> Result<(), BmcError> {
        let addr = (self.t.host.as_str(), self.t.port)
            .to_socket_addrs()
            .map_err(|e| BmcError::Unreachable {
                bmc: self.t.name.clone(),
                detail: format!("cannot resolve {}: {e}", self.t.host),
            })?
            .next()
            .ok_or_else(|| BmcError::Unreachable {
                bmc: self.t.name.clone(),
                detail: format!("{} resolves to no address", self.t.host),
            })?;
        let mut last = String::new();
        for attempt in 0..self.t.attempts {
            let mut rmcp =
                Rmcp::new(addr, self.t.reply_timeout).map_err(|e| BmcError::Unreachable {
                    bmc: self.t.name.clone(),
                    detail: format!("socket: {e}"),
                })?;
            match rmcp.activate(
                true,
                Some(&self.t.username),
                Some(self.t.password.as_bytes()),
            ) {
                Ok(()) => {
                    self.rmcp = Some(rmcp);
                    self.last_used = Instant::now();
                    break;
                }
                Err(e) => match classify_activation(&e) {
                    ActivationFailure::Retry(d) => {
                        debug!(bmc = %self.t.name, attempt, detail = %d, "session activation: no answer; retrying");
                        last = d;
                    }
                    ActivationFailure::Refused(d) => {
                        return Err(BmcError::Unreachable {
                            bmc: self.t.name.clone(),
                            detail: d,
                        });
                    }
                    ActivationFailure::Auth(d) => {
                        return Err(BmcError::Auth {
                            bmc: self.t.name.clone(),
                            detail: d,
                        });
                    }
                    ActivationFailure::Other(d) => {
                        return Err(BmcError::Protocol {
                            bmc: self.t.name.clone(),
                            what: "RMCP+ session activation".into(),
                            detail: d,
                        });
                    }
                },
            }
        }
        if self.rmcp.is_none() {
            return Err(BmcError::Timeout {
                bmc: self.t.name.clone(),
                what: format!("RMCP presence ping / session activation ({last})"),
                waited_ms: (self.t.reply_timeout * self.t.attempts).as_millis() as u64,
            });
        }
        // ipmi-rs asks for administrator in RAKP but never raises the session to it.
        match self.exchange(NetFn::App, 0x3B, &[0x04]) {
            Exchange::Reply(0, _) => {
                if self.said_open {
                    debug!(bmc = %self.t.name, "IPMI session opened (administrator)");
                } else {
                    info!(bmc = %self.t.name, "IPMI session opened (administrator)");
                    self.said_open = true;
                }
                Ok(())
            }
            Exchange::Reply(cc, _) => {
                self.close();
                Err(BmcError::Auth {
                    bmc: self.t.name.clone(),
                    detail: format!(
                        "Set Session Privilege Level (administrator) answered 0x{cc:02x} ({}); the user needs the administrator privilege",
                        completion_code_text(cc)
                    ),
                })
            }
            Exchange::Timeout => {
                self.rmcp = None;
                Err(self.timeout_err("Set Session Privilege Level"))
            }
            Exchange::Broken(d) => Err(self.broken("Set Session Privilege Level", d)),
        }
    }

    /// Closes the session if there is one, best effort. Close Session needs the BMC's session
    /// id, which ipmi-rs 0.6 keeps private; it shows only in the connection's `Debug` output,
    /// so it is read from there. Without it, Close Session by handle (from Get Session Info)
    /// is tried, which some BMCs (ipmi_sim among them) refuse; the session then expires.
    fn close(&mut self) {
        let Some(rmcp) = self.rmcp.as_ref() else {
            return;
        };
        let id = session_id_from_debug(&format!("{rmcp:?}"));
        let attempts = self.t.attempts;
        // One try each: closing is a courtesy to the BMC's session table, not worth waiting for.
        self.t.attempts = 1;
        let data = match id {
            Some(id) => Some(id.to_le_bytes().to_vec()),
            None => match self.exchange(NetFn::App, 0x3D, &[0x00]) {
                Exchange::Reply(0, d) if !d.is_empty() => Some(vec![0, 0, 0, 0, d[0]]),
                _ => None,
            },
        };
        match data.map(|d| self.exchange(NetFn::App, 0x3C, &d)) {
            Some(Exchange::Reply(0, _)) => debug!(bmc = %self.t.name, "session closed"),
            Some(Exchange::Reply(cc, _)) => {
                debug!(bmc = %self.t.name, cc, "BMC refused Close Session; session left to expire")
            }
            _ => debug!(bmc = %self.t.name, "session not closed; left to expire"),
        }
        self.t.attempts = attempts;
        self.rmcp = None;
    }
}

/// How close to the end of a long wait a socket read timeout ends it (a read may return
/// a little before its timeout).
const READ_SLACK: Duration = Duration::from_millis(20);

/// Chassis controls that do something again each time they are received: a cycle or a
/// reset sent twice power-cycles or resets the machine twice. On, off and soft-off sent twice
/// leave it as once.
pub fn repeats_harm(op: ChassisOp) -> bool {
    matches!(op, ChassisOp::Cycle | ChassisOp::Reset)
}

/// Extracts `session_id: N` from ipmi-rs's `Debug` of an active RMCP+ connection.
pub fn session_id_from_debug(debug: &str) -> Option<u32> {
    let rest = debug.split("session_id: ").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|&id| id != 0)
}

enum ActivationFailure {
    Retry(String),
    Refused(String),
    Auth(String),
    Other(String),
}

fn classify_activation(e: &ActivationError) -> ActivationFailure {
    let io_kind = |e: &std::io::Error| e.kind();
    match e {
        ActivationError::PongReceive(io) | ActivationError::PingSend(io)
            if matches!(io_kind(io), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            ActivationFailure::Retry("no RMCP pong".into())
        }
        ActivationError::PongReceive(io) | ActivationError::PingSend(io) => {
            ActivationFailure::Refused(format!("RMCP presence ping: {io}"))
        }
        // Debug names ("PongRead") told an operator nothing: say what was seen and what to check.
        ActivationError::PongRead | ActivationError::RmcpError(_) => ActivationFailure::Other(
            "the answer to the RMCP presence ping is not an RMCP pong: is an IPMI BMC \
             (IPMI over LAN, UDP 623) on this host and port?"
                .into(),
        ),
        ActivationError::IpmiNotSupported | ActivationError::NoSupportedIpmiLANVersions => {
            ActivationFailure::Other(
                "the RMCP pong says this host does not offer IPMI over LAN: enable it on the BMC"
                    .into(),
            )
        }
        ActivationError::V2_0(v2) => match v2 {
            V2_0ActivationError::OpenSessionResponseReceive(RmcpIpmiReceiveError::Io(io))
            | V2_0ActivationError::RakpMessage2Receive(RmcpIpmiReceiveError::Io(io))
            | V2_0ActivationError::RakpMessage4Receive(RmcpIpmiReceiveError::Io(io))
                if matches!(io_kind(io), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                ActivationFailure::Retry(format!("no answer during RMCP+ handshake: {v2:?}"))
            }
            V2_0ActivationError::RakpMessage2Parse(p) => {
                ActivationFailure::Auth(format!("RAKP message 2: {p:?} (unknown user name?)"))
            }
            V2_0ActivationError::RakpMessage4Parse(p) => {
                ActivationFailure::Auth(format!("RAKP message 4: {p:?}"))
            }
            V2_0ActivationError::ServerAuthenticationFailed
            | V2_0ActivationError::RakpMessage4InvalidIntegrityCheckValue => {
                ActivationFailure::Auth("RAKP integrity check failed (wrong password?)".into())
            }
            V2_0ActivationError::OpenSessionResponseParse(p) => ActivationFailure::Other(format!(
                "open session refused: {p:?} (cipher suite 3 not enabled on the BMC?)"
            )),
            other => ActivationFailure::Other(format!("{other:?}")),
        },
        ActivationError::GetChannelAuthenticationCapabilities(e) => match e {
            ipmi_rs::IpmiError::Connection(RmcpIpmiError::Receive(RmcpIpmiReceiveError::Io(
                io,
            ))) if matches!(io_kind(io), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                ActivationFailure::Retry(
                    "no answer to Get Channel Authentication Capabilities".into(),
                )
            }
            other => ActivationFailure::Other(format!(
                "Get Channel Authentication Capabilities: {other:?}"
            )),
        },
        other => ActivationFailure::Other(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_node_busy_and_bmc_initializing_count_as_busy() {
        assert!(is_busy_code(0xC0) && is_busy_code(0xD2));
        for cc in [0x00, 0xC1, 0xC3, 0xCC, 0xD4, 0xD5, 0xFF] {
            assert!(!is_busy_code(cc), "0x{cc:02x}");
        }
        assert_eq!(completion_code_text(0xD2), "BMC initializing");
    }

    /// A port answering the presence ping with anything but a pong said "PongRead".
    #[test]
    fn a_garbled_pong_is_named_in_words() {
        let ActivationFailure::Other(d) = classify_activation(&ActivationError::PongRead) else {
            panic!("not Other")
        };
        assert!(d.contains("not an RMCP pong") && d.contains("port"), "{d}");
    }

    #[test]
    fn control_bytes_follow_the_spec() {
        assert_eq!(chassis_control_byte(ChassisOp::Off), 0);
        assert_eq!(chassis_control_byte(ChassisOp::On), 1);
        assert_eq!(chassis_control_byte(ChassisOp::Cycle), 2);
        assert_eq!(chassis_control_byte(ChassisOp::Reset), 3);
        assert_eq!(chassis_control_byte(ChassisOp::SoftOff), 5);
    }

    #[test]
    fn reads_the_session_id_from_debug_output() {
        assert_eq!(
            session_id_from_debug(
                "V2_0(State { socket: X, session_id: 1670, session_sequence_number: 3 })"
            ),
            Some(1670)
        );
        assert_eq!(session_id_from_debug("nothing here"), None);
    }

    #[test]
    fn a_failed_rakp_integrity_check_is_refused_credentials() {
        // ipmi-rs logs "Received RAKP message 2 with invalid integrity check value" and
        // returns ServerAuthenticationFailed when the password is wrong.
        for e in [
            V2_0ActivationError::ServerAuthenticationFailed,
            V2_0ActivationError::RakpMessage4InvalidIntegrityCheckValue,
        ] {
            assert!(
                matches!(classify_activation(&ActivationError::V2_0(e)), ActivationFailure::Auth(d) if d.contains("wrong password")),
            );
        }
    }

    #[test]
    fn status_bit_zero_is_power() {
        assert_eq!(parse_chassis_status(&[0x61, 0, 0]), Some(PowerState::On));
        assert_eq!(parse_chassis_status(&[0x60, 0, 0]), Some(PowerState::Off));
        assert_eq!(parse_chassis_status(&[]), None);
    }

    #[tokio::test]
    async fn silent_bmc_times_out_after_retries() {
        // A bound UDP socket that never answers: the ping is retried, then a timeout.
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let p = IpmiPowerControl::new(IpmiTarget {
            name: "silent".into(),
            host: "127.0.0.1".into(),
            port,
            username: "u".into(),
            password: "p".into(),
            reply_timeout: Duration::from_millis(50),
            attempts: 2,
        });
        let t = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(5), p.power_state())
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, BmcError::Timeout { .. }), "{e}");
        assert!(t.elapsed() >= Duration::from_millis(100));
        // The presence ping (RMCP header, class ASF 0x06) was sent once per attempt: a lost
        // datagram is retried.
        let mut buf = [0u8; 64];
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut pings = 0;
        while let Ok((n, _)) = sock.recv_from(&mut buf) {
            assert_eq!(&buf[..4], &[0x06, 0x00, 0xFF, 0x06], "{:?}", &buf[..n]);
            pings += 1;
        }
        assert_eq!(pings, 2);
    }
}
