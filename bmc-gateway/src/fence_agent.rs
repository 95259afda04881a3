//! The fence-agent backend: a [`PowerControl`] that runs an installed ClusterLabs fence agent
//! (`fence_ipmilan`, `fence_redfish`, `fence_apc_snmp`, … from Debian's `fence-agents`) for
//! one device, or for one outlet of a PDU.
//!
//! The agent gets its options on standard input as `key=value` lines, the way Pacemaker's
//! fencer hands them over, never on its command line, so no password shows in `ps` (what the
//! agent itself then passes to the tools it runs, e.g. `snmpget -c`, is the agent's doing).
//! Actions are `status`, `on` and `off`; the exit codes are read as the agents define them
//! (`status`: 0 on, 2 off, anything else an error; `on`/`off`: 0 done). Each run is bounded:
//! past its limit the agent's whole process group is killed. What the agent wrote is kept,
//! cut to its end and escaped, for the operator.
//!
//! One device runs one agent at a time ([`AgentDevice`] holds the lock), so the two outlets of
//! a PDU that feed two machines are never switched by two agents at once. This module decides
//! nothing about levels; see [`crate::levels`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::power::{BmcError, ChassisOp, PowerControl, PowerState};

/// Default limit for one run of an agent.
///
/// 40 s: an agent's `off` waits for the state to read off itself (`power_wait` plus up to
/// `power_timeout`, 20 s by default in the agents), after a login that may retry; longer means
/// the device is not going to answer.
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(40);

/// Most bytes of an agent's output kept for a message: the end is where agents say why they
/// failed, and a looping agent must not fill the gateway's memory or the coordinator's history.
const KEPT_OUTPUT: usize = 600;

/// The directories searched for an agent named without a path: Debian installs the agents in
/// `/usr/sbin`, which is not on an unprivileged user's `PATH`.
const AGENT_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/local/sbin"];

/// Finds the agent `name` (a path as given, else along `PATH` and the sbin directories).
pub fn find_agent(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return protocol::process_tree::resolve_program(name);
    }
    protocol::process_tree::resolve_program(name).or_else(|| {
        AGENT_DIRS
            .iter()
            .map(|d| PathBuf::from(d).join(name))
            .find(|p| protocol::process_tree::resolve_program(&p.display().to_string()).is_some())
    })
}

/// One fence device: the agent and the options every run gets (address, credentials, the
/// device's own settings). Shared by the outlets of a PDU.
pub struct AgentDevice {
    /// `name (agent host:port)`, for messages.
    pub name: String,
    program: PathBuf,
    options: BTreeMap<String, String>,
    timeout: Duration,
    /// One agent run at a time on this device.
    busy: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for AgentDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the options: they hold the password.
        f.debug_struct("AgentDevice")
            .field("name", &self.name)
            .field("program", &self.program)
            .finish()
    }
}

/// What one run of an agent ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRun {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// The end of stdout and stderr, escaped.
    pub said: String,
}

impl AgentDevice {
    /// A device run by `program` with `options` (the `key=value` lines, `action` and `plug`
    /// excepted), each run within `timeout`.
    pub fn new(
        name: String,
        program: PathBuf,
        options: BTreeMap<String, String>,
        timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            name,
            program,
            options,
            timeout,
            busy: tokio::sync::Mutex::new(()),
        })
    }

    /// The standard input for `action` on `plug`: one `key=value` line per option.
    fn stdin_text(&self, action: &str, plug: Option<&str>) -> String {
        let mut s = format!("action={action}\n");
        if let Some(p) = plug {
            s.push_str(&format!("plug={p}\n"));
        }
        for (k, v) in &self.options {
            s.push_str(&format!("{k}={v}\n"));
        }
        s
    }

    /// Runs the agent for `action` on `plug` and returns how it ended; errors only when it
    /// could not be started or did not end in time.
    pub async fn run(&self, action: &str, plug: Option<&str>) -> Result<AgentRun, BmcError> {
        let _one = self.busy.lock().await;
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("LC_ALL", "C")
            // Debian's agents import a module Python 3.11 warns about on every run.
            .env("PYTHONWARNINGS", "ignore::DeprecationWarning")
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| BmcError::Unsupported {
            bmc: self.name.clone(),
            what: action.into(),
            detail: format!("cannot run {}: {e}", self.program.display()),
        })?;
        let pgid = child.id();
        let input = self.stdin_text(action, plug);
        let mut stdin = child.stdin.take().expect("piped");
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let work = async {
            // An agent that exits without reading its input closes the pipe: not an error here,
            // its exit code says what happened.
            let _ = stdin.write_all(input.as_bytes()).await;
            drop(stdin);
            let (mut o, mut e) = (Vec::new(), Vec::new());
            let read = async {
                let _ = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
            };
            let status = protocol::process_tree::wait_reading_output(&mut child, read).await;
            (status, o, e)
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok((Ok(status), o, e)) => Ok(AgentRun {
                code: status.code(),
                said: kept(&o, &e, self.options.values()),
            }),
            Ok((Err(e), _, _)) => Err(BmcError::Protocol {
                bmc: self.name.clone(),
                what: action.into(),
                detail: format!("waiting for {}: {e}", self.program.display()),
            }),
            Err(_) => {
                if let Some(p) = pgid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                Err(BmcError::Timeout {
                    bmc: self.name.clone(),
                    what: format!("{} {action}", self.agent_name()),
                    waited_ms: self.timeout.as_millis() as u64,
                })
            }
        }
    }

    /// The agent's file name, e.g. `fence_apc_snmp`.
    pub fn agent_name(&self) -> String {
        self.program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Reads the power state of `plug` (or of the device): `status`, 0 on, 2 off.
    pub async fn status(&self, plug: Option<&str>) -> Result<PowerState, BmcError> {
        let r = self.run("status", plug).await?;
        match r.code {
            Some(0) => Ok(PowerState::On),
            Some(2) => Ok(PowerState::Off),
            _ => Err(self.failure("status", plug, &r)),
        }
    }

    /// Switches `plug` (or the device) `on` or `off`; returns what the agent said.
    pub async fn switch(&self, on: bool, plug: Option<&str>) -> Result<String, BmcError> {
        let action = if on { "on" } else { "off" };
        let r = self.run(action, plug).await?;
        match r.code {
            Some(0) => Ok(if r.said.is_empty() {
                format!("{} {action}: exit 0", self.agent_name())
            } else {
                r.said
            }),
            _ => Err(self.failure(action, plug, &r)),
        }
    }

    /// The error for a run that did not succeed: "could not reach" when the agent says it
    /// could not connect or log in (the words the agents' library uses), else a refusal.
    fn failure(&self, action: &str, plug: Option<&str>, r: &AgentRun) -> BmcError {
        let what = match plug {
            Some(p) => format!("{} {action} of outlet {p}", self.agent_name()),
            None => format!("{} {action}", self.agent_name()),
        };
        let code = match r.code {
            Some(c) => format!("exit {c}"),
            None => "killed by a signal".into(),
        };
        let detail = format!(
            "{code}: {}",
            if r.said.is_empty() {
                "(no output)"
            } else {
                r.said.as_str()
            }
        );
        let lower = r.said.to_ascii_lowercase();
        let unreachable = [
            "unable to connect",
            "connection timed out",
            "timeout",
            "timed out",
            "no route",
            "connection refused",
        ]
        .iter()
        .any(|w| lower.contains(w));
        if unreachable {
            BmcError::Unreachable {
                bmc: self.name.clone(),
                detail: format!("{what}: {detail}"),
            }
        } else {
            BmcError::Refused {
                bmc: self.name.clone(),
                what,
                detail,
            }
        }
    }
}

/// The end of an agent's stdout and stderr as one escaped line, with any option value (a
/// password) an agent echoed blotted out.
fn kept<'a>(out: &[u8], err: &[u8], secrets: impl Iterator<Item = &'a String>) -> String {
    let mut text = String::new();
    for part in [out, err] {
        let s = String::from_utf8_lossy(part);
        let s = s.trim();
        if !s.is_empty() {
            if !text.is_empty() {
                text.push_str(" | ");
            }
            text.push_str(
                &s.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
    }
    for v in secrets {
        // Only values long enough not to blot out ordinary words ("1", "on", a port).
        if v.len() >= 4 {
            text = text.replace(v.as_str(), "***");
        }
    }
    let escaped: String = text.chars().flat_map(|c| c.escape_debug()).collect();
    let escaped = escaped.replace("\\'", "'").replace("\\\"", "\"");
    if escaped.len() > KEPT_OUTPUT {
        let mut cut = escaped.len() - KEPT_OUTPUT;
        while !escaped.is_char_boundary(cut) {
            cut += 1;
        }
        format!("…{}", &escaped[cut..])
    } else {
        escaped
    }
}

/// A machine's power through a fence agent: the whole device (a BMC driven by
/// `fence_ipmilan`, `fence_redfish`, …) or one outlet of a PDU (`plug`).
pub struct AgentPowerControl {
    device: Arc<AgentDevice>,
    plug: Option<String>,
}

impl AgentPowerControl {
    /// The power of `device`, or of its outlet `plug`.
    pub fn new(device: Arc<AgentDevice>, plug: Option<String>) -> Self {
        Self { device, plug }
    }

    /// `pdu-a outlet 3`, or the device's name.
    pub fn describe(&self) -> String {
        match &self.plug {
            Some(p) => format!("{} outlet {p}", self.device.name),
            None => self.device.name.clone(),
        }
    }
}

impl PowerControl for AgentPowerControl {
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
        Box::pin(async move { self.device.status(self.plug.as_deref()).await })
    }

    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
        Box::pin(async move {
            match op {
                ChassisOp::On => self.device.switch(true, self.plug.as_deref()).await,
                ChassisOp::Off => self.device.switch(false, self.plug.as_deref()).await,
                other => Err(BmcError::Unsupported {
                    bmc: self.describe(),
                    what: other.as_str().into(),
                    detail: "a fence agent is asked only status, on and off".into(),
                }),
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes an agent script into `dir` that logs its stdin to `dir/stdin` and its argv to
    /// `dir/argv`, then runs `body`.
    fn agent(dir: &std::path::Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fence_test");
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"$@\" > {d}/argv\ncat > {d}/stdin\n{body}\n",
                d = dir.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn device(program: PathBuf, timeout: Duration) -> Arc<AgentDevice> {
        let mut o = BTreeMap::new();
        o.insert("ip".to_string(), "127.0.0.1".to_string());
        o.insert("password".to_string(), "s3cret-pw".to_string());
        AgentDevice::new(
            "pdu-a (fence_test 127.0.0.1:161)".into(),
            program,
            o,
            timeout,
        )
    }

    #[tokio::test]
    async fn options_go_on_stdin_never_on_the_command_line() {
        let d = tempfile::tempdir().unwrap();
        let dev = device(agent(d.path(), "exit 0"), Duration::from_secs(5));
        assert_eq!(dev.status(Some("3")).await.unwrap(), PowerState::On);
        let stdin = std::fs::read_to_string(d.path().join("stdin")).unwrap();
        assert_eq!(
            stdin,
            "action=status\nplug=3\nip=127.0.0.1\npassword=s3cret-pw\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("argv")).unwrap(),
            "\n"
        );
    }

    #[tokio::test]
    async fn exit_codes_read_as_the_agents_define_them() {
        let d = tempfile::tempdir().unwrap();
        let dev = device(agent(d.path(), "exit 2"), Duration::from_secs(5));
        assert_eq!(dev.status(None).await.unwrap(), PowerState::Off);
        let dev = device(
            agent(
                d.path(),
                "echo 'Failed: Unable to connect/login to fencing device' >&2; exit 1",
            ),
            Duration::from_secs(5),
        );
        let e = dev.status(None).await.unwrap_err();
        assert!(e.is_unreachable(), "{e}");
        let dev = device(
            agent(
                d.path(),
                "echo 'Failed: outlet refused, password s3cret-pw' >&2\nprintf 'tab\\there\\n' >&2; exit 1",
            ),
            Duration::from_secs(5),
        );
        let e = dev.switch(false, Some("3")).await.unwrap_err();
        assert!(!e.is_retriable(), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("fence_test off of outlet 3"), "{msg}");
        assert!(
            msg.contains("exit 1: Failed: outlet refused, password ***; tab\\there"),
            "{msg}"
        );
        assert!(!msg.contains("s3cret"), "{msg}");
    }

    #[tokio::test]
    async fn an_agent_past_its_limit_is_killed_with_what_it_started() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("late");
        let dev = device(
            agent(
                d.path(),
                &format!("(sleep 2; touch {}) &\nsleep 30", marker.display()),
            ),
            Duration::from_millis(300),
        );
        let t = std::time::Instant::now();
        let e = dev.switch(false, None).await.unwrap_err();
        assert!(matches!(e, BmcError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            !marker.exists(),
            "a child of the killed agent acted after its limit"
        );
    }

    #[test]
    fn long_output_keeps_its_end() {
        let long = "x".repeat(2000) + "the reason";
        let k = kept(long.as_bytes(), b"", std::iter::empty());
        assert!(k.starts_with('…') && k.ends_with("the reason"), "{k}");
        assert!(k.len() <= KEPT_OUTPUT + '…'.len_utf8());
    }
}
