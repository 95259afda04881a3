//! A real Kubernetes control plane for the tests: etcd, `kube-apiserver` and
//! `kube-controller-manager`, built from their Go modules by `scripts/build-k8s.sh` (which
//! `scripts/setup-test-deps.sh` runs) and started here on loopback with certificates made by
//! the project's own PKI, a token file, random ports and a temporary directory each. Dropping
//! a [`RealK8s`] kills the three processes and removes the directory.
//!
//! The controller manager runs the controllers the coordinator relies on, with the real
//! timings except the node monitor's grace period, which [`Options::node_monitor_grace`]
//! shortens for fast tests: the node lifecycle controller (Ready Unknown, unreachable taints),
//! the taint-eviction controller (pods of a NoExecute-tainted node become terminating), the
//! pod GC (every 20 s, force-deletes terminating pods of a not-Ready out-of-service node,
//! and pods of a deleted Node after 40 s), the attach-detach controller and the disruption
//! controller (PodDisruptionBudget status).
//!
//! No kubelet and no CSI driver run: [`kubelet`] plays both through the API, as they do
//! (Node registration, Lease renewals, node and pod status, the end of a pod's graceful
//! termination; the external-attacher's side of a VolumeAttachment). That part is a stand-in
//! and says so; everything the controllers decide is real.
//!
//! Missing binaries are an error that says to run `scripts/setup-test-deps.sh`.

pub mod kubelet;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use protocol::identity::Role;
use protocol::pki::{Ca, IssueOptions};

use crate::etcd::Etcd;
use crate::go_peers::binaries;
use crate::procs::{Proc, free_tcp_port};

/// How long the control plane may take to come up on a loaded 2-core machine (the API
/// server alone needs 5–15 s to install its built-in resources).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The token of the test's own client (group `system:masters`).
const ADMIN_TOKEN: &str = "fleetmend-test-admin-token";
/// The controller manager's token (group `system:masters`: it runs without per-controller
/// service accounts, so it needs every controller's rights).
const KCM_TOKEN: &str = "fleetmend-test-kcm-token";

/// The controllers the coordinator relies on (their names as kube-controller-manager 1.33+
/// spells them).
pub const CONTROLLERS: &[&str] = &[
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "persistentvolume-attach-detach-controller",
    "disruption-controller",
];

/// How to start the control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--node-monitor-grace-period`: how long a Node may go without a Lease renewal before
    /// the node lifecycle controller sets Ready Unknown (Kubernetes' default is 50 s).
    pub node_monitor_grace: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            node_monitor_grace: Duration::from_secs(5),
        }
    }
}

/// A running etcd + kube-apiserver + kube-controller-manager. Dropping it stops them.
pub struct RealK8s {
    // Dropped in this order: the controller manager first, etcd last.
    kcm: Option<Proc>,
    apiserver: Proc,
    etcd: Etcd,
    url: String,
    kubeconfig: PathBuf,
    client: kube::Client,
    /// The binaries' directory.
    pub bin_dir: PathBuf,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for RealK8s {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealK8s").field("url", &self.url).finish()
    }
}

fn kubeconfig(url: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {url}\n    \
         certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: real\n  context:\n    cluster: real\n    user: {user}\n\
         current-context: real\n",
        ca.display()
    )
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl RealK8s {
    /// Starts etcd, the API server and the controller manager, and waits until the API
    /// server is ready.
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        let bin_dir = binaries()?;
        let dir = tempfile::tempdir()?;
        let d = dir.path().to_path_buf();
        // Certificates from the project's own PKI: a CA, the API server's serving
        // certificate for 127.0.0.1 and localhost, and a key that signs service account
        // tokens (the API server insists on one even when nothing uses them).
        let ca = Ca::generate("k8s.test").context("make the test cluster's CA")?;
        let serving = ca.issue(
            Role::Coordinator,
            "kube-apiserver",
            &IssueOptions {
                ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
                dns: vec!["localhost".into()],
                validity_days: 2,
                clock_offset_secs: 0,
            },
        )?;
        let sa = ca.issue(
            Role::Coordinator,
            "service-accounts",
            &IssueOptions::loopback(),
        )?;
        for (name, text) in [
            ("ca.crt", ca.cert_pem()),
            ("apiserver.crt", serving.cert_pem.as_str()),
            ("apiserver.key", serving.key_pem.as_str()),
            ("sa.key", sa.key_pem.as_str()),
            ("sa.crt", sa.cert_pem.as_str()),
            (
                "tokens.csv",
                &format!(
                    "{ADMIN_TOKEN},fleetmend-test-admin,uid-admin,\"system:masters\"\n\
                     {KCM_TOKEN},system:kube-controller-manager,uid-kcm,\"system:masters\"\n"
                ),
            ),
        ] {
            std::fs::write(d.join(name), text)?;
        }

        // The test kit's etcd (one member, plain HTTP on loopback), started without waiting:
        // the API server retries until it answers.
        let etcd = Etcd::launch(crate::etcd::Options::default())?;

        let api_port = free_tcp_port();
        let url = format!("https://127.0.0.1:{api_port}");
        let mut api_cmd = Command::new(bin_dir.join("kube-apiserver"));
        api_cmd.args([
            &format!("--etcd-servers={}", etcd.endpoint(0)),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={api_port}"),
            &format!("--cert-dir={}", d.join("certs").display()),
            &format!("--tls-cert-file={}", d.join("apiserver.crt").display()),
            &format!(
                "--tls-private-key-file={}",
                d.join("apiserver.key").display()
            ),
            &format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            // The verifying side takes the public key, here in its certificate.
            &format!("--service-account-key-file={}", d.join("sa.crt").display()),
            &format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16",
            // No service account controller runs, so pods cannot get the default account.
            "--disable-admission-plugins=ServiceAccount",
            // No Service traffic: the kubernetes Service's endpoints are not kept.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ]);
        let apiserver = Proc::spawn("kube-apiserver", api_cmd, &d.join("kube-apiserver.log"))?;

        let admin = d.join("admin.kubeconfig");
        std::fs::write(
            &admin,
            kubeconfig(&url, &d.join("ca.crt"), "fleetmend-test-admin", ADMIN_TOKEN),
        )?;
        let kcm_config = d.join("kcm.kubeconfig");
        std::fs::write(
            &kcm_config,
            kubeconfig(
                &url,
                &d.join("ca.crt"),
                "system:kube-controller-manager",
                KCM_TOKEN,
            ),
        )?;
        let client = client_for(&admin).await?;
        let mut rk = Self {
            kcm: None,
            apiserver,
            etcd,
            url,
            kubeconfig: admin,
            client,
            bin_dir: bin_dir.clone(),
            dir,
        };
        rk.wait_ready().await?;

        let mut kcm_cmd = Command::new(bin_dir.join("kube-controller-manager"));
        kcm_cmd.args([
            &format!("--kubeconfig={}", kcm_config.display()),
            &format!("--controllers={}", CONTROLLERS.join(",")),
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            // The controller manager's own HTTPS endpoint is not needed.
            "--secure-port=0",
            // The node lifecycle controller checks every second (its default is 5 s), so a
            // test sees Ready Unknown within a second of the grace period.
            "--node-monitor-period=1s",
            &format!(
                "--node-monitor-grace-period={}",
                secs(opts.node_monitor_grace)
            ),
            "--v=2",
        ]);
        rk.kcm = Some(Proc::spawn(
            "kube-controller-manager",
            kcm_cmd,
            &rk.dir.path().join("kube-controller-manager.log"),
        )?);
        Ok(rk)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("static request");
            let last = match self.client.request_text(req).await {
                Ok(t) if t.trim() == "ok" => return Ok(()),
                Ok(t) => t,
                Err(e) => e.to_string(),
            };
            let exited = self.etcd.try_exit(0).or_else(|| self.apiserver.try_exit());
            if exited.is_some() || tokio::time::Instant::now() >= deadline {
                bail!(
                    "kube-apiserver not ready (exited: {exited:?}; waited at most {START_TIMEOUT:?}; \
                     last answer: {last}); \
                     its log ends:\n{}\netcd's log ends:\n{}",
                    tail(&self.apiserver.log_text(), 20),
                    self.etcd.log_tail(0, 10)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig with the test's admin token (group `system:masters`), for the
    /// coordinator under test.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client with the admin token.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The controller manager's log so far (for tests that show what a controller did).
    pub fn controller_log(&self) -> String {
        self.kcm.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// The last lines of each component's log, for a failing test's message.
    pub fn logs_tail(&self, n: usize) -> String {
        format!(
            "--- kube-controller-manager ---\n{}\n--- kube-apiserver ---\n{}",
            tail(&self.controller_log(), n),
            tail(&self.apiserver.log_text(), n)
        )
    }
}

/// A kube client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.read_timeout = Some(Duration::from_secs(30));
    Ok(kube::Client::try_from(cfg)?)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
