//! `cycle-floor`: what one node-agent report cycle costs the kernel alone, for comparison
//! with the agent's measured CPU per cycle (`scripts/footprint-vs-node-exporter.sh`).
//!
//! One thread does, every interval, the system-level work of an agent cycle with no QUIC,
//! TLS, async runtime or parsing: it sleeps until the interval ends, sends an HTTP/1.1 GET
//! over a kept-alive TCP connection to a stand-in kubelet and reads the answer, reads the
//! files the agent reads (each NIC's `operstate`, `carrier`, `carrier_changes` and `uevent`
//! with one `pread` on a kept descriptor, the boot id, the kdump files, opened again each
//! cycle when missing as the agent does), `statfs`es each mount, and sends a 160-byte UDP
//! datagram (an encrypted report's size), reads a 90-byte reply and sends a 40-byte one (the
//! acknowledgement), the three packets of an agent's report. The stand-in servers are
//! threads of this process, so, as with the agent on loopback, the receivers' network
//! processing of what this thread sends is charged to it, and their wake-ups are not.
//!
//! It prints the on-CPU time of that one thread per cycle (`/proc/thread-self/schedstat`,
//! after a warm-up of 10 % of the cycles), the same counter the footprint script reads for
//! the agent.
//!
//! Usage: `cycle-floor [--interval 1s] [--cycles 60] [--nic NAME]... [--mount PATH]...`
//! (defaults: 1 s, 60 cycles, the host's interfaces that are up except `lo`, mount `/`).

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

struct Args {
    interval: Duration,
    cycles: u32,
    nics: Vec<String>,
    mounts: Vec<PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        interval: Duration::from_secs(1),
        cycles: 60,
        nics: Vec::new(),
        mounts: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--interval" => {
                let v = value()?;
                a.interval = protocol::duration::parse(&v)
                    .map_err(|e| anyhow::anyhow!("--interval {v:?}: {e}"))?;
            }
            "--cycles" => {
                let v = value()?;
                a.cycles = v
                    .parse()
                    .with_context(|| format!("--cycles {v:?} is not a count"))?;
            }
            "--nic" => a.nics.push(value()?),
            "--mount" => a.mounts.push(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!(
                    "usage: cycle-floor [--interval 1s] [--cycles 60] [--nic NAME]... [--mount PATH]..."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if a.cycles < 10 {
        bail!("--cycles must be at least 10");
    }
    if a.nics.is_empty() {
        a.nics = up_interfaces();
    }
    if a.mounts.is_empty() {
        a.mounts.push(PathBuf::from("/"));
    }
    Ok(a)
}

/// The host's interfaces that are up, except loopback (as the footprint script's agents).
fn up_interfaces() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    let mut out: Vec<String> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .filter(|n| {
            std::fs::read_to_string(format!("/sys/class/net/{n}/operstate"))
                .is_ok_and(|s| s.trim() == "up")
        })
        .collect();
    out.sort();
    out
}

/// The kubelet's `/healthz` on loopback, keep-alive.
fn kubelet() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0
                        || c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

/// The coordinator's side of a report: a reply to each report, nothing to an ack.
fn coordinator() -> anyhow::Result<u16> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    let port = s.local_addr()?.port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let reply = [0x5au8; 90];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            if n > 100 && s.send_to(&reply, from).is_err() {
                return;
            }
        }
    });
    Ok(port)
}

fn thread_cpu_ns() -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")
        .context("reading /proc/thread-self/schedstat")?;
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("unexpected /proc/thread-self/schedstat")
}

/// A file read with one `pread` per cycle on a kept descriptor, or opened again each cycle
/// while it is missing.
struct Kept {
    path: PathBuf,
    file: Option<File>,
}

impl Kept {
    fn new(path: impl AsRef<Path>) -> Self {
        let path = path.as_ref().to_path_buf();
        Self {
            file: File::open(&path).ok(),
            path,
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> usize {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        self.file
            .as_ref()
            .and_then(|f| f.read_at(buf, 0).ok())
            .unwrap_or(0)
    }
}

fn main() -> anyhow::Result<()> {
    protocol::telemetry::quiet_broken_pipe();
    let args = parse_args()?;
    let mut http = TcpStream::connect(("127.0.0.1", kubelet()?))?;
    http.set_nodelay(true)?;
    let udp = UdpSocket::bind("127.0.0.1:0")?;
    udp.connect(("127.0.0.1", coordinator()?))?;
    let mut files: Vec<Kept> = Vec::new();
    for n in &args.nics {
        for attr in ["operstate", "carrier", "carrier_changes", "uevent"] {
            files.push(Kept::new(format!("/sys/class/net/{n}/{attr}")));
        }
    }
    files.push(Kept::new("/proc/sys/kernel/random/boot_id"));
    files.push(Kept::new("/sys/kernel/kexec_crash_loaded"));
    files.push(Kept::new("/sys/kernel/kexec_crash_size"));

    let report = [0xa5u8; 160];
    let ack = [0x3cu8; 40];
    let mut buf = [0u8; 4096];
    let warmup = args.cycles / 10;
    let mut next = Instant::now() + args.interval;
    let mut start_ns = 0;
    for cycle in 0..warmup + args.cycles {
        if cycle == warmup {
            start_ns = thread_cpu_ns()?;
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next += args.interval;
        http.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
        for f in &mut files {
            f.read(&mut buf);
        }
        for m in &args.mounts {
            nix::sys::statfs::statfs(m).with_context(|| format!("statfs {}", m.display()))?;
        }
        if http.read(&mut buf)? == 0 {
            bail!("the stand-in kubelet closed the connection");
        }
        udp.send(&report)?;
        udp.recv(&mut buf)?;
        udp.send(&ack)?;
    }
    let used = thread_cpu_ns()? - start_ns;
    println!(
        "cycle-floor: {:.3} ms per cycle ({} cycles at {:?}; nics {}; {} files, {} mounts)",
        used as f64 / 1e6 / f64::from(args.cycles),
        args.cycles,
        args.interval,
        args.nics.join(","),
        files.len(),
        args.mounts.len()
    );
    Ok(())
}
