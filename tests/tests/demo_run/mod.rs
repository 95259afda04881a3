//! The demo process as the demo tests drive it (`demo.rs`, and `etcd_demo.rs` for the runs
//! that need the Go-built etcd, which the suite's runner starts last): its stdout read line by
//! line, the processes it leaves behind found by a marker in their environment, and the
//! three stories as the timeline and summary must tell them. What one file does not use is
//! allowed to stay unused there.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use testkit::procs::{bin_dir, command, wait_for};

/// The demo takes about 20 s on an idle machine; this bounds it on a loaded one.
pub(crate) const DEMO_TIMEOUT: Duration = Duration::from_secs(150);

/// The demo process with its stdout lines arriving on a channel.
pub(crate) struct Run {
    pub(crate) child: Child,
    pub(crate) lines: mpsc::Receiver<String>,
    marker: String,
    pub(crate) seen: Vec<String>,
}

impl Run {
    pub(crate) fn start(args: &[&str]) -> anyhow::Result<Self> {
        let marker = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
        let mut cmd = command("fleetmend-demo");
        cmd.args(args)
            .env("FLEETMEND_BIN_DIR", bin_dir())
            .env("DEMO_TEST_MARKER", &marker)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("cannot start fleetmend-demo")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            marker,
            seen: Vec::new(),
        })
    }

    /// Reads lines until one contains `needle` or stdout ends; returns that line.
    pub(crate) fn until(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let found = l.contains(needle);
                    self.seen.push(l.clone());
                    if found {
                        return Ok(l);
                    }
                }
                Err(_) => bail!(
                    "no line with {needle:?} within {timeout:?}; output so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the exit; returns its code and all of stdout.
    pub(crate) fn finish(&mut self, timeout: Duration) -> anyhow::Result<(Option<i32>, String)> {
        let status = wait_for("fleetmend-demo to exit", timeout, || {
            self.child
                .try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "running".to_string())
        });
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("{e}; output so far:\n{}", self.seen.join("\n"));
            }
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        Ok((status.code(), self.seen.join("\n")))
    }

    /// Processes still carrying the marker: pid and command line.
    fn leftovers(&self) -> Vec<(u32, String)> {
        let needle = format!("DEMO_TEST_MARKER={}", self.marker);
        let mut found = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return found;
        };
        for e in dir.flatten() {
            let p = e.path();
            let Ok(env) = std::fs::read(p.join("environ")) else {
                continue;
            };
            if env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
                    continue;
                };
                let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
                found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
            }
        }
        found
    }

    /// Waits (a little: a killed process takes a moment to go) until nothing is left.
    pub(crate) fn assert_nothing_left(&self) -> anyhow::Result<()> {
        wait_for(
            "the demo's processes to be gone",
            Duration::from_secs(10),
            || {
                let left = self.leftovers();
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}"))
                }
            },
        )
    }
}

impl Drop for Run {
    /// Kills the demo and, when a test failed because it left some, whatever it left.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for (pid, _) in self.leftovers() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// The demo's working directory, from its first line.
pub(crate) fn work_dir(out: &str) -> Option<&str> {
    out.lines()
        .find_map(|l| l.strip_prefix("Fleetmend demo: working in "))
}

/// The three stories as the demo's timeline and summary must tell them: the hung kubelet
/// restarted, the dead machine fenced through the gateway (off, workload released, on), the
/// rack outage held; each summary row expected.
pub(crate) fn assert_the_stories_ended_as_described(out: &str) -> anyhow::Result<()> {
    assert!(
        out.contains("power control: a bmc-gateway on 127.0.0.1:")
            && out.contains("in front of 8 OpenIPMI ipmi_sim BMCs"),
        "the demo did not start its gateway and BMCs:\n{out}"
    );
    // The timeline shows the coordinator deciding by itself, as an operator reads it.
    for needle in [
        "admitted [auto-repair]: admitted: 192.0.2.12 operation unhealthy",
        "command-succeeded: step 0: @restart-unit kubelet",
        "admitted [auto-repair]: admitted: 192.0.2.13 operation unreachable",
        "held [correlated-failure]: held: rack rack-2 lost 4 of 4 machines",
        "coordinatorctl remediation status: held: rack rack-2",
    ] {
        assert!(out.contains(needle), "no {needle:?} in:\n{out}");
    }
    // The dead machine's procedure, as its entry's history tells it. The fence flow also
    // releases the workload, between the power-off and the power-on.
    for needle in [
        "command-succeeded: step 0: fence flow",
        "node.kubernetes.io/out-of-service taint set on Node demo-r1-n3",
        "workload released: pod demo/db-0 is gone from demo-r1-n3",
        "node.kubernetes.io/out-of-service taint removed from Node demo-r1-n3",
    ] {
        assert!(out.contains(needle), "no {needle:?} in:\n{out}");
    }
    // The power actions as the dead machine's BMC applied them: off, then on (the boot).
    let bmc = "demo-r1-n3's BMC (ipmi_sim on 127.0.0.1:";
    let power: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" power ") && l.contains(bmc))
        .collect();
    assert_eq!(power.len(), 2, "{power:#?}\n{out}");
    assert!(
        power[0].contains("applied `power 0` from the bmc-gateway: powered off at "),
        "{}",
        power[0]
    );
    assert!(
        power[1].contains("applied `power 1` from the bmc-gateway: powered on at ")
            && power[1].contains("boots with a new boot id"),
        "{}",
        power[1]
    );
    assert!(
        !out.contains("stand-in"),
        "the stand-in ran although ipmi_sim is installed:\n{out}"
    );
    // The summary: one row per injected failure, each expected.
    let summary = out
        .split_once("\nSummary\n")
        .map(|(_, s)| s)
        .context("no summary")?;
    for injected in [
        "a kubelet hangs on demo-r1-n2",
        "demo-r1-n3 dies",
        "rack-2 loses power",
    ] {
        let row = summary
            .lines()
            .find(|l| l.trim_start().starts_with(injected))
            .with_context(|| format!("no summary row for {injected:?}:\n{summary}"))?;
        let rest = row.trim_start()[injected.len()..].trim_start();
        assert!(rest.starts_with("yes "), "{row}");
    }
    assert!(
        summary.contains(" through the bmc-gateway: its ipmi_sim BMC powered it off at "),
        "{summary}"
    );
    assert!(
        summary.contains("All 3 injected failures ended as described."),
        "{summary}"
    );
    for cmd in ["repair-queue list", "events", "remediation status"] {
        assert!(
            summary
                .lines()
                .any(|l| l.contains("coordinatorctl --profile ") && l.ends_with(cmd)),
            "no look-closer command for {cmd:?}:\n{summary}"
        );
    }
    Ok(())
}
