//! A real etcd for the tests: the v3.6 `etcd` binary that `scripts/build-k8s.sh` builds from
//! its Go module (the same one [`crate::real_k8s`] runs under the API server), started on
//! loopback with random ports and a temporary data directory per member.
//!
//! - [`Etcd::start`]: one member or a cluster of several (issue 31's three), waiting until
//!   every member answers `/health`; [`Etcd::launch`] starts without waiting (the real
//!   control plane starts the API server meanwhile).
//! - Faults on one member: [`Etcd::stop`] (SIGTERM), [`Etcd::kill`] (SIGKILL),
//!   [`Etcd::pause`] / [`Etcd::resume`] (SIGSTOP / SIGCONT) and [`Etcd::restart`] on the same
//!   ports and data directory, so clients configured with the endpoints find it again.
//! - Optional client TLS ([`Options::tls`]): a CA, a serving certificate for 127.0.0.1 and a
//!   client certificate, made with the project's own PKI (rcgen), and `--client-cert-auth`
//!   so a client without a certificate from that CA is refused.
//!
//! `/health` is read on a plain-HTTP metrics listener of each member, so the kit never needs
//! a client certificate to see whether a member serves. No fake etcd: there is none here.
//! Dropping an [`Etcd`] kills every member and removes the directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use protocol::identity::Role;
use protocol::pki::{Ca, IssueOptions};

use crate::procs::{Proc, free_tcp_port, http_get, wait_for};

/// How long members may take to elect a leader and answer `/health` on a loaded 2-core
/// machine (an idle one needs about a second; a restart after SIGKILL replays its WAL).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start etcd.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many members (1 or an odd number for a cluster).
    pub members: usize,
    /// Client TLS with client-certificate authentication.
    pub tls: bool,
    /// fsync as a production member does (benchmarks); tests skip it.
    pub durable: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            members: 1,
            tls: false,
            durable: false,
        }
    }
}

impl Options {
    /// A cluster of `n` members.
    pub fn cluster(n: usize) -> Self {
        Self {
            members: n,
            ..Self::default()
        }
    }

    /// With client TLS.
    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Writing to disk as a production member does (every commit fsynced), for figures
    /// comparable with SQLite's `synchronous = FULL`.
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }
}

/// Client TLS files of an etcd started with [`Options::tls`].
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The CA that signed the members' serving certificates (and the client's).
    pub ca: PathBuf,
    /// A client certificate etcd accepts.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    metrics_port: u16,
    proc: Option<Proc>,
    paused: bool,
}

/// Running etcd members. Dropping it kills them and removes their directory.
pub struct Etcd {
    // Dropped before `dir`.
    members: Vec<Member>,
    bin: PathBuf,
    tls: Option<ClientTls>,
    token: String,
    durable: bool,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

/// The cached `etcd` binary (see [`crate::go_peers::etcd_binary`]: a build under way is
/// waited for only until its etcd is built).
pub fn binary() -> anyhow::Result<PathBuf> {
    Ok(crate::go_peers::etcd_binary()?.join("etcd"))
}

impl Etcd {
    /// Starts the members and waits until each one answers `/health` (a leader elected and a
    /// linearizable read served).
    pub fn start(opts: Options) -> anyhow::Result<Self> {
        let etcd = Self::launch(opts)?;
        for i in 0..etcd.members.len() {
            etcd.wait_healthy(i)?;
        }
        Ok(etcd)
    }

    /// Starts the members without waiting for them.
    pub fn launch(opts: Options) -> anyhow::Result<Self> {
        if opts.members == 0 {
            bail!("an etcd needs at least one member");
        }
        let bin = binary()?;
        let dir = tempfile::Builder::new().prefix("etcd-test").tempdir()?;
        let tls = if opts.tls {
            Some(make_tls(dir.path())?)
        } else {
            None
        };
        let members = (0..opts.members)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_tcp_port(),
                peer_port: free_tcp_port(),
                metrics_port: free_tcp_port(),
                proc: None,
                paused: false,
            })
            .collect();
        // A cluster token of its own, so members of two tests' clusters can never join.
        let token = format!(
            "fleetmend-test-{}-{}",
            std::process::id(),
            dir.path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        let mut etcd = Self {
            members,
            bin,
            tls,
            token,
            durable: opts.durable,
            dir,
        };
        for i in 0..etcd.members.len() {
            etcd.spawn(i)?;
        }
        Ok(etcd)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let scheme = self.scheme();
        let cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let data = self.dir.path().join(&m.name);
        let mut cmd = Command::new(&self.bin);
        cmd.args([
            format!("--name={}", m.name),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={cluster}"),
            format!("--initial-cluster-token={}", self.token),
            // Ignored by a member that restarts on its data directory.
            "--initial-cluster-state=new".into(),
            format!("--listen-metrics-urls=http://127.0.0.1:{}", m.metrics_port),
            "--log-level=warn".into(),
        ]);
        // A test's store is thrown away: no fsync, so a loaded disk does not slow every
        // write (the API server's Lease renewals, a conformance suite's transactions).
        if !self.durable {
            cmd.arg("--unsafe-no-fsync");
        }
        if let Some(tls) = &self.tls {
            let d = self.dir.path();
            cmd.args([
                format!("--cert-file={}", d.join("server.crt").display()),
                format!("--key-file={}", d.join("server.key").display()),
                format!("--trusted-ca-file={}", tls.ca.display()),
                "--client-cert-auth".into(),
            ]);
        }
        let log = self.dir.path().join(format!("{}.log", m.name));
        let proc = Proc::spawn(&format!("etcd {}", m.name), cmd, &log)?;
        let m = &mut self.members[i];
        m.proc = Some(proc);
        m.paused = false;
        Ok(())
    }

    /// The client URLs of every member (`http://127.0.0.1:PORT`, `https://…` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        )
    }

    /// The client TLS files, when started with [`Options::tls`].
    pub fn client_tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true (an etcd has at least one member); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s answer to `GET /health`, or why there is none.
    pub fn health(&self, i: usize) -> Result<String, String> {
        let addr = ([127, 0, 0, 1], self.members[i].metrics_port).into();
        match http_get(addr, "/health") {
            Ok((200, body)) if body.contains("\"true\"") => Ok(body),
            Ok((code, body)) => Err(format!("HTTP {code}: {}", body.trim())),
            Err(e) => Err(format!("{e:#}")),
        }
    }

    /// Whether member `i` is the cluster's raft leader now (its `/metrics`'
    /// `etcd_server_is_leader`); an error when it does not answer.
    pub fn leads(&self, i: usize) -> anyhow::Result<bool> {
        let addr = ([127, 0, 0, 1], self.members[i].metrics_port).into();
        let (code, body) = http_get(addr, "/metrics")?;
        anyhow::ensure!(code == 200, "etcd member {i}'s /metrics: HTTP {code}");
        body.lines()
            .find_map(|l| l.strip_prefix("etcd_server_is_leader "))
            .map(|v| v.trim() == "1")
            .with_context(|| format!("etcd member {i}'s /metrics has no etcd_server_is_leader"))
    }

    /// A running member that is not the raft leader (so killing it costs no election); the
    /// last such one, to keep the choice stable.
    pub fn a_follower(&self) -> anyhow::Result<usize> {
        (0..self.members.len())
            .rev()
            .find(|&i| matches!(self.leads(i), Ok(false)))
            .context("no running member is a follower")
    }

    /// The member that is the raft leader now.
    pub fn leader(&self) -> anyhow::Result<usize> {
        (0..self.members.len())
            .find(|&i| matches!(self.leads(i), Ok(true)))
            .context("no running member leads")
    }

    /// Waits until member `i` answers `/health` with true; an error with its log's end if it
    /// exits or does not within [`START_TIMEOUT`].
    pub fn wait_healthy(&self, i: usize) -> anyhow::Result<()> {
        let m = &self.members[i];
        wait_for(&format!("etcd {} healthy", m.name), START_TIMEOUT, || {
            self.health(i)
        })
        .map(drop)
        .with_context(|| format!("etcd {}'s log ends:\n{}", m.name, self.log_tail(i, 15)))
    }

    /// Member `i`'s log so far.
    pub fn log_text(&self, i: usize) -> String {
        self.members[i]
            .proc
            .as_ref()
            .map(Proc::log_text)
            .unwrap_or_else(|| {
                std::fs::read_to_string(self.dir.path().join(format!("m{i}.log")))
                    .unwrap_or_default()
            })
    }

    /// The last `n` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        let text = self.log_text(i);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The exit status of member `i` if it has exited by itself.
    pub fn try_exit(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.members[i].proc.as_mut().and_then(Proc::try_exit)
    }

    /// Member `i`'s process id while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].proc.as_ref().and_then(Proc::pid)
    }

    /// Stops member `i` with SIGTERM (SIGKILL after 10 s).
    pub fn stop(&mut self, i: usize) -> anyhow::Result<()> {
        self.resume(i)?;
        if let Some(mut p) = self.members[i].proc.take() {
            p.sigterm(Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.sigkill();
        }
        self.members[i].paused = false;
    }

    /// Freezes member `i` (SIGSTOP): its ports stay open and answer nothing.
    /// Returns once every thread of it is stopped: `kill` returns when the signal is sent,
    /// and a thread running on another CPU (or a descheduled virtual CPU) may still answer
    /// a request for a moment after that.
    pub fn pause(&mut self, i: usize) -> anyhow::Result<()> {
        self.signal(i, "-STOP")?;
        self.members[i].paused = true;
        let pid = self.pid(i).context("etcd stopped while being paused")?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            if std::time::Instant::now() > deadline {
                bail!("etcd m{i} (pid {pid}) did not stop within 10 s of SIGSTOP");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Thaws member `i` after [`Etcd::pause`] (SIGCONT).
    pub fn resume(&mut self, i: usize) -> anyhow::Result<()> {
        if self.members[i].paused {
            self.signal(i, "-CONT")?;
            self.members[i].paused = false;
        }
        Ok(())
    }

    fn signal(&self, i: usize, sig: &str) -> anyhow::Result<()> {
        let pid = self
            .pid(i)
            .with_context(|| format!("etcd m{i} is not running"))?;
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill {sig} {pid} (etcd m{i}) failed: {status}");
        }
        Ok(())
    }

    /// Starts member `i` again (after [`Etcd::stop`] or [`Etcd::kill`]; a running one is
    /// killed first) on its ports and data directory, and waits until it is healthy. A
    /// member of a cluster whose quorum is gone is not healthy alone: start the others
    /// first with [`Etcd::restart_no_wait`].
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.restart_no_wait(i)?;
        self.wait_healthy(i)
    }

    /// Starts member `i` again without waiting.
    pub fn restart_no_wait(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// The directory holding the members' data directories and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too; kill them all before the directory goes.
        for m in &mut self.members {
            if let Some(mut p) = m.proc.take() {
                p.sigkill();
            }
        }
    }
}

/// Whether every thread of process `pid` is in the stopped state (`T` in
/// `/proc/<pid>/task/<tid>/stat`). A thread that is gone counts as stopped.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return true;
        };
        // The state is the first field after the command name's closing parenthesis.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "T" || state == "t")
    })
}

/// A CA, a serving certificate for 127.0.0.1 and localhost, and a client certificate.
fn make_tls(dir: &Path) -> anyhow::Result<ClientTls> {
    let ca = Ca::generate("etcd.test").context("make the test etcd's CA")?;
    let serving = ca.issue(
        Role::Coordinator,
        "etcd",
        &IssueOptions {
            ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            dns: vec!["localhost".into()],
            validity_days: 2,
            clock_offset_secs: 0,
        },
    )?;
    let client = ca.issue(Role::Coordinator, "etcd-client", &IssueOptions::loopback())?;
    let files = ClientTls {
        ca: dir.join("ca.crt"),
        cert: dir.join("client.crt"),
        key: dir.join("client.key"),
    };
    for (path, text) in [
        (files.ca.clone(), ca.cert_pem()),
        (dir.join("server.crt"), serving.cert_pem.as_str()),
        (dir.join("server.key"), serving.key_pem.as_str()),
        (files.cert.clone(), client.cert_pem.as_str()),
        (files.key.clone(), client.key_pem.as_str()),
    ] {
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(files)
}

/// One single-member etcd shared by the tests of one test binary that hold it at the same
/// time (each test takes its own key prefix, [`fresh_prefix`]). It is started on first use
/// and killed when the last holder drops it, so a test binary leaves no etcd behind, even
/// when a test fails (unwinding drops the holder). Tests that stop, pause or kill members
/// start their own [`Etcd`].
pub fn shared() -> anyhow::Result<std::sync::Arc<Etcd>> {
    use std::sync::{Arc, Mutex, Weak};
    static SHARED: Mutex<Weak<Etcd>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = slot.upgrade() {
        return Ok(e);
    }
    let e = Arc::new(Etcd::start(Options::default())?);
    *slot = Arc::downgrade(&e);
    Ok(e)
}

/// A key prefix no other test of this process uses (`/fleetmend-test/<pid>-<n>-<name>`).
pub fn fresh_prefix(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "/fleetmend-test/{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
