//! The standard `process_*` metrics Prometheus users expect on every `/metrics` (resident
//! memory, CPU seconds, open file descriptors, start time), read from `/proc/self`.
//!
//! The names, types and units are the ones Prometheus' own client libraries export, so
//! existing dashboards and alerts (`process_resident_memory_bytes`, `rate(process_cpu_seconds_total[5m])`)
//! work unchanged. On a system without `/proc` (not Linux) nothing is rendered.

use std::fmt::Write as _;

/// Clock ticks per second of the times in `/proc/<pid>/stat`. Linux reports them in
/// `USER_HZ`, which is 100 on every architecture it supports (the kernel converts from its
/// internal `HZ`), so it is a constant rather than a `sysconf` call.
const USER_HZ: f64 = 100.0;

/// One reading of the process's own counters.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors, when known.
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// Reads the current process's figures, `None` when `/proc` is not there or not readable.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        Self::parse(&stat, &status, &boot, open_fds, &limits)
    }

    /// Builds the figures from the text of `/proc/self/stat`, `/proc/self/status`,
    /// `/proc/stat` and `/proc/self/limits`, and a count of open descriptors.
    pub fn parse(
        stat: &str,
        status: &str,
        proc_stat: &str,
        open_fds: u64,
        limits: &str,
    ) -> Option<Self> {
        // The command name (field 2) is in parentheses and may hold spaces or ')'; every
        // field after the last ')' is a number.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is f[0], so field N of proc(5) is f[N - 3].
        let ticks = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        let utime = ticks(14)?;
        let stime = ticks(15)?;
        let start_ticks = ticks(22)?;
        let vsize = ticks(23)?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())?;
        let btime = proc_stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<u64>().ok())?;
        let max_fds = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok());
        Some(Self {
            cpu_seconds: (utime + stime) as f64 / USER_HZ,
            resident_bytes: rss_kib * 1024,
            virtual_bytes: vsize,
            open_fds,
            max_fds,
            start_time_seconds: btime as f64 + start_ticks as f64 / USER_HZ,
        })
    }

    /// Appends the figures in the Prometheus text format.
    pub fn render_into(&self, out: &mut String) {
        let mut series = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
        };
        series(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            format!("{:.2}", self.cpu_seconds),
        );
        series(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes.to_string(),
        );
        series(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            self.virtual_bytes.to_string(),
        );
        series(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            self.open_fds.to_string(),
        );
        if let Some(max) = self.max_fds {
            series(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                max.to_string(),
            );
        }
        series(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            format!("{:.2}", self.start_time_seconds),
        );
    }
}

/// Appends the current process's `process_*` series to `out` (nothing where `/proc` is
/// missing).
pub fn render_into(out: &mut String) {
    if let Some(s) = ProcessStats::read() {
        s.render_into(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real /proc/self/stat line, with a command name holding a space and a ')'.
    const STAT: &str = "4242 (fleet mend) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 3 0 123456 104857600 1500 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
    const STATUS: &str =
        "Name:\tfleetmend\nVmPeak:\t  110000 kB\nVmRSS:\t    6000 kB\nThreads:\t3\n";
    const PROC_STAT: &str = "cpu  1 2 3 4\nbtime 1763800000\nprocesses 100\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 524288               files     \n";

    #[test]
    fn parses_cpu_memory_start_time_and_limits() {
        let s = ProcessStats::parse(STAT, STATUS, PROC_STAT, 12, LIMITS).unwrap();
        assert_eq!(s.cpu_seconds, 3.25);
        assert_eq!(s.resident_bytes, 6000 * 1024);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.open_fds, 12);
        assert_eq!(s.max_fds, Some(1024));
        assert_eq!(s.start_time_seconds, 1_763_800_000.0 + 1234.56);
    }

    #[test]
    fn garbled_input_gives_nothing_rather_than_wrong_numbers() {
        assert!(ProcessStats::parse("no parenthesis", STATUS, PROC_STAT, 1, LIMITS).is_none());
        assert!(ProcessStats::parse(STAT, "VmRSS: lots\n", PROC_STAT, 1, LIMITS).is_none());
        assert!(ProcessStats::parse(STAT, STATUS, "cpu 1\n", 1, LIMITS).is_none());
        // Unknown limits only drop process_max_fds.
        let s = ProcessStats::parse(STAT, STATUS, PROC_STAT, 1, "").unwrap();
        assert_eq!(s.max_fds, None);
    }

    #[test]
    fn renders_every_series_with_help_and_type() {
        let s = ProcessStats::parse(STAT, STATUS, PROC_STAT, 12, LIMITS).unwrap();
        let mut out = String::new();
        s.render_into(&mut out);
        for (name, kind, value) in [
            ("process_cpu_seconds_total", "counter", "3.25"),
            ("process_resident_memory_bytes", "gauge", "6144000"),
            ("process_open_fds", "gauge", "12"),
            ("process_max_fds", "gauge", "1024"),
            ("process_start_time_seconds", "gauge", "1763801234.56"),
        ] {
            assert!(out.contains(&format!("# TYPE {name} {kind}\n")), "{out}");
            assert!(
                out.contains(&format!("\n{name} {value}\n")),
                "{name}: {out}"
            );
        }
    }

    #[test]
    fn reads_this_process() {
        let s = ProcessStats::read().expect("/proc is readable on Linux");
        assert!(s.resident_bytes > 0);
        assert!(s.open_fds >= 3, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started in the last day, not in the future (allowing for tick rounding).
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0);
    }
}
