//! The health checks. Each check is a function over the node's root directory (and, for
//! kubelet, an HTTP endpoint) that returns [`CheckResult`]s; [`Checker`] runs the configured
//! set in a fixed order and keeps the little state checks need between rounds (the last
//! carrier change counters, for flaps, and the sysfs files read every round, open: see
//! `kept`).
//!
//! Beyond those four: plugin checks (`plugin`, node-problem-detector's contract), NVIDIA
//! GPU Xid errors from the kernel log (`gpu`) and EDAC memory ECC counters (`memory`).
//!
//! Checks never fail as a whole: an unreadable file is a `fail` or `unknown` result with the
//! path in its detail, so one broken subsystem cannot hide the others. They deliberately do
//! not decide whether the machine should be repaired; the coordinator does.

pub(crate) mod base;
pub mod config;
pub mod disk;
pub mod gpu;
pub mod kdump;
pub(crate) mod kept;
pub mod kubelet;
pub mod memory;
pub mod nic;
pub mod plugin;
pub mod xid;

use std::path::PathBuf;

use protocol::messages::CheckResult;

use crate::config::Config;

pub(crate) use base::read_trimmed;
pub use base::{result, under_root};

/// Runs the configured checks; owns the state kept between rounds.
pub struct Checker {
    root: PathBuf,
    nics: Vec<String>,
    mounts: Vec<crate::config::MountConfig>,
    kdump: bool,
    kubelet: Option<kubelet::KubeletClient>,
    nic_tracker: nic::NicTracker,
    kdump_files: kdump::KdumpFiles,
    fs: Box<dyn disk::FsStats>,
    mount_table: disk::MountTable,
    plugins: plugin::Plugins,
    gpu: Option<gpu::GpuCheck>,
    memory: Option<memory::MemoryCheck>,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("root", &self.root)
            .field("nics", &self.nics)
            .field("mounts", &self.mounts)
            .field("kdump", &self.kdump)
            .field("kubelet", &self.kubelet)
            .field("plugins", &self.plugins)
            .field("gpu", &self.gpu.is_some())
            .field("memory", &self.memory.is_some())
            .finish_non_exhaustive()
    }
}

impl Checker {
    /// A checker for `cfg`, reading filesystem usage with statvfs.
    pub fn new(cfg: &Config) -> Self {
        Self::with_fs(cfg, Box::new(disk::Statvfs))
    }

    /// A checker with another [`disk::FsStats`] (tests).
    pub fn with_fs(cfg: &Config, fs: Box<dyn disk::FsStats>) -> Self {
        let kubelet = cfg.kubelet.url.as_ref().map(|u| {
            kubelet::KubeletClient::new(
                kubelet::HttpUrl::parse(u).expect("kubelet URL validated with the config"),
                cfg.kubelet.timeout,
            )
        });
        Self {
            root: cfg.root.clone(),
            nics: cfg.nics.clone(),
            mounts: cfg.mounts.clone(),
            kdump: cfg.kdump,
            kubelet,
            nic_tracker: nic::NicTracker::default(),
            kdump_files: kdump::KdumpFiles::new(&cfg.root),
            fs,
            mount_table: disk::MountTable::new(&cfg.root),
            plugins: plugin::Plugins::new(&cfg.checks),
            gpu: gpu::GpuCheck::new(
                &cfg.root,
                &cfg.checks.gpu,
                &cfg.actions.state_dir,
                // Without a boot id the saved findings cannot be told from another boot's:
                // none match it, and the log is read from its start.
                &crate::node::boot_id(&cfg.root).unwrap_or_default(),
            ),
            memory: memory::MemoryCheck::new(&cfg.root, &cfg.checks.memory),
        }
    }

    /// Runs every check once; the results are in the order kubelet, NICs, mounts, kdump,
    /// plugins, GPUs, memory controllers.
    ///
    /// The kubelet's request goes out first and the file checks run while the kubelet
    /// answers: by the time they are done the answer has usually arrived, and the agent
    /// reads it without going to sleep and being woken for it (one wakeup less per report).
    pub async fn run(&mut self) -> Vec<CheckResult> {
        let Self {
            root,
            nics,
            mounts,
            kdump,
            kubelet,
            nic_tracker,
            kdump_files,
            fs,
            mount_table,
            plugins,
            gpu,
            memory,
        } = self;
        let mut out = Vec::with_capacity(2 + nics.len() + mounts.len());
        let kubelet = async {
            match kubelet {
                Some(k) => Some(k.check().await),
                None => None,
            }
        };
        let files = async {
            let mut out = Vec::with_capacity(1 + nics.len() + mounts.len());
            for n in nics.iter() {
                out.push(nic::check(root, n, nic_tracker));
            }
            if !mounts.is_empty() {
                out.extend(mount_table.check(mounts, fs.as_ref()));
            }
            if *kdump {
                out.push(kdump_files.check());
            }
            out
        };
        // Biased: polled in this order, so the kubelet's request is sent (its future then
        // waits for the answer) before the file checks run to the end in one poll.
        let (kubelet, files) = tokio::join!(biased; kubelet, files);
        out.extend(kubelet);
        out.extend(files);
        if !plugins.is_empty() {
            out.extend(plugins.poll().await);
        }
        if let Some(g) = gpu {
            out.extend(g.check());
        }
        if let Some(m) = memory {
            out.extend(m.check());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::io::{self, BufRead, BufReader, Write};
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use protocol::messages::{CheckKind, CheckStatus};

    use super::*;
    use crate::config::{KubeletConfig, MountConfig};
    use crate::testkit_fixture::NodeFixture;

    /// Counts the rounds of file checks (one mount, so one call per round).
    struct CountingFs(Arc<AtomicUsize>);

    impl disk::FsStats for CountingFs {
        fn usage(&self, _: &Path) -> io::Result<disk::FsUsage> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(disk::FsUsage {
                blocks: 100,
                blocks_avail: 90,
                files: 100,
                files_free: 90,
                read_only: false,
            })
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_kubelet_is_asked_before_the_file_checks_run() {
        let fx = NodeFixture::builder("n").mount("/var").build().unwrap();
        // A kubelet on one kept-alive connection that answers request n only once the file
        // checks of round n have run. Were they run after the kubelet's answer (one after
        // the other, as before), it would wait for them and the check would time out.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/healthz", listener.local_addr().unwrap());
        let rounds = Arc::new(AtomicUsize::new(0));
        let seen = rounds.clone();
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            for n in 1.. {
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let t = Instant::now();
                while seen.load(Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .is_err()
                {
                    return;
                }
            }
        });
        let cfg = Config {
            coordinator: None,
            report_interval: Duration::from_secs(5),
            root: fx.root().to_path_buf(),
            hostname: None,
            nics: vec![],
            mounts: vec![MountConfig::new("/var")],
            kubelet: KubeletConfig {
                url: Some(url),
                timeout: Duration::from_secs(1),
            },
            kdump: true,
            actions: Default::default(),
            checks: Default::default(),
            source: None,
        };
        let mut checker = Checker::with_fs(&cfg, Box::new(CountingFs(rounds.clone())));
        for round in 1..=3 {
            let results = checker.run().await;
            let kinds: Vec<CheckKind> = results.iter().map(|r| r.kind).collect();
            assert_eq!(
                kinds,
                [CheckKind::Kubelet, CheckKind::Disk, CheckKind::Kdump],
                "results keep their order"
            );
            assert_eq!(
                results[0].status,
                CheckStatus::Ok,
                "round {round}: {:?}",
                results[0]
            );
            assert_eq!(rounds.load(Ordering::SeqCst), round);
        }
    }
}
