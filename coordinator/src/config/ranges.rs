//! Every duration of the coordinator's configuration with the range it accepts: the one
//! table ([`RANGES`]) that `check` and start apply, and that `docs/operations.md` lists.
//!
//! A duration outside its range is refused naming its key: `health.unreachable_grace =
//! "100000h"` would otherwise mean a dead machine is never judged unreachable, with no word.
//! The ends are far from every sensible value (a minimum keeps a limit from failing
//! everything at once or a loop from spinning; a maximum is where a setting stops doing its
//! job); the relations between keys (a grace at least one report interval) stay with the
//! checks of their sections.
//!
//! This module only reads a parsed [`Config`]; it does not parse durations.

use std::time::Duration;

use protocol::duration::{Range, Ranges};

use super::{Config, FenceOverride};

const MIN: Duration = Duration::from_secs(60);
const H: Duration = Duration::from_secs(3600);

/// 10 ms: the shortest period or limit any loop or request of the coordinator works with
/// (tests run whole fleets at a few hundred milliseconds); shorter is a typo for seconds.
const SHORTEST: Duration = Duration::from_millis(10);

const fn r(min: Duration, max: Duration) -> Range {
    Range::new(min, max)
}

/// A loop's period or one request's limit: up to 10 minutes, past which the view it keeps
/// is too old to act on.
const PERIOD: Range = r(SHORTEST, Duration::from_secs(600));
/// A power step's limit: a BMC that has not powered a machine off or on within an hour
/// will not.
const POWER: Range = r(SHORTEST, H);
/// A wait for a server or its workload (a release, a boot, a dump): a day.
const DAY: Range = r(SHORTEST, Duration::from_secs(24 * 3600));
/// How long records are kept: 90 days (2160h).
const KEEP: Duration = Duration::from_secs(90 * 24 * 3600);

/// Every duration key (`*` is a table's name, `[]` a list's entry) and its range.
pub(crate) const RANGES: Ranges = Ranges(&[
    (
        "shutdown_grace",
        r(Duration::ZERO, Duration::from_secs(600)),
    ),
    (
        "health.report_interval",
        r(SHORTEST, protocol::messages::MAX_REPORT_INTERVAL),
    ),
    ("health.unreachable_grace", r(SHORTEST, H)),
    (
        "health.goodbye_grace",
        r(SHORTEST, Duration::from_secs(6 * 3600)),
    ),
    ("fence.off_timeout", POWER),
    ("fence.on_timeout", POWER),
    ("fence.release_timeout", DAY),
    ("fence.back_timeout", DAY),
    ("fence.machine_types.*.off_timeout", POWER),
    ("fence.machine_types.*.on_timeout", POWER),
    ("fence.machine_types.*.release_timeout", DAY),
    ("fence.machine_types.*.back_timeout", DAY),
    ("fence.gateways.*.off_timeout", POWER),
    ("fence.gateways.*.on_timeout", POWER),
    ("fence.gateways.*.release_timeout", DAY),
    ("fence.gateways.*.back_timeout", DAY),
    ("kubernetes.node_view_refresh", PERIOD),
    ("kubernetes.request_timeout", PERIOD),
    ("kdump.timeout", DAY),
    ("kdump.timeout_by_machine_type.*", DAY),
    ("remediation.interval", PERIOD),
    ("remediation.journal_retention", r(MIN, KEEP)),
    (
        "remediation.delete_succeeded_after",
        r(Duration::ZERO, KEEP),
    ),
    ("remediation.lease_stale", r(SHORTEST, H)),
    ("remediation.kdump_wait", r(Duration::ZERO, H)),
    (
        "remediation.auto_repair.unhealthy_for",
        r(Duration::ZERO, DAY.max),
    ),
    ("remediation.auto_repair.sabakan.timeout", PERIOD),
    (
        "remediation.health_checks[].node_startup_timeout",
        r(Duration::ZERO, DAY.max),
    ),
    (
        "remediation.health_checks[].unhealthy_conditions[].timeout",
        r(Duration::ZERO, DAY.max),
    ),
    (
        "remediation.limits.slow_start.success_after",
        r(Duration::ZERO, DAY.max),
    ),
    (
        "remediation.limits.slow_start.lookback",
        r(MIN, Duration::from_secs(30 * 24 * 3600)),
    ),
    (
        "remediation.limits.correlated_failure.window",
        r(SHORTEST, H),
    ),
    ("remediation.limits.self_isolation.window", r(SHORTEST, H)),
    (
        "remediation.limits.self_isolation.settle",
        r(Duration::ZERO, H),
    ),
    ("remediation.limits.escalation.window", r(MIN, KEEP)),
]);

/// One duration as configured: the table's pattern, the key as written, the value.
type Setting = (&'static str, String, Duration);

/// Every duration `cfg` holds, defaults included, keyed as the file writes them.
fn settings(cfg: &Config) -> Vec<Setting> {
    let mut out: Vec<Setting> = Vec::new();
    let mut one = |pattern: &'static str, key: String, d: Option<Duration>| {
        if let Some(d) = d {
            out.push((pattern, key, d));
        }
    };
    one(
        "shutdown_grace",
        "shutdown_grace".into(),
        Some(cfg.shutdown_grace),
    );
    let h = &cfg.health;
    one(
        "health.report_interval",
        "health.report_interval".into(),
        Some(h.report_interval),
    );
    one(
        "health.unreachable_grace",
        "health.unreachable_grace".into(),
        h.unreachable_grace,
    );
    one(
        "health.goodbye_grace",
        "health.goodbye_grace".into(),
        Some(h.goodbye_grace),
    );
    let f = &cfg.fence;
    one(
        "fence.off_timeout",
        "fence.off_timeout".into(),
        Some(f.off_timeout),
    );
    one(
        "fence.on_timeout",
        "fence.on_timeout".into(),
        Some(f.on_timeout),
    );
    one(
        "fence.release_timeout",
        "fence.release_timeout".into(),
        Some(f.release_timeout),
    );
    one(
        "fence.back_timeout",
        "fence.back_timeout".into(),
        Some(f.back_timeout),
    );
    let overrides: [(&str, [&'static str; 4], _); 2] = [
        (
            "machine_types",
            [
                "fence.machine_types.*.off_timeout",
                "fence.machine_types.*.on_timeout",
                "fence.machine_types.*.release_timeout",
                "fence.machine_types.*.back_timeout",
            ],
            &f.machine_types,
        ),
        (
            "gateways",
            [
                "fence.gateways.*.off_timeout",
                "fence.gateways.*.on_timeout",
                "fence.gateways.*.release_timeout",
                "fence.gateways.*.back_timeout",
            ],
            &f.gateways,
        ),
    ];
    for (table, [off, on, release, back], map) in overrides {
        for (name, o) in map.iter() {
            let o: &FenceOverride = o;
            let key = |k: &str| format!("fence.{table}.{name}.{k}");
            one(off, key("off_timeout"), o.off_timeout);
            one(on, key("on_timeout"), o.on_timeout);
            one(release, key("release_timeout"), o.release_timeout);
            one(back, key("back_timeout"), o.back_timeout);
        }
    }
    if let Some(k) = &cfg.kubernetes {
        one(
            "kubernetes.node_view_refresh",
            "kubernetes.node_view_refresh".into(),
            Some(k.node_view_refresh),
        );
        one(
            "kubernetes.request_timeout",
            "kubernetes.request_timeout".into(),
            Some(k.request_timeout),
        );
    }
    one(
        "kdump.timeout",
        "kdump.timeout".into(),
        Some(cfg.kdump.timeout),
    );
    for (t, d) in &cfg.kdump.timeout_by_machine_type {
        one(
            "kdump.timeout_by_machine_type.*",
            format!("kdump.timeout_by_machine_type.{t}"),
            Some(*d),
        );
    }
    if let Some(r) = &cfg.remediation {
        let key = |k: &str| format!("remediation.{k}");
        one("remediation.interval", key("interval"), Some(r.interval));
        one(
            "remediation.journal_retention",
            key("journal_retention"),
            Some(r.journal_retention),
        );
        one(
            "remediation.delete_succeeded_after",
            key("delete_succeeded_after"),
            r.delete_succeeded_after,
        );
        one(
            "remediation.lease_stale",
            key("lease_stale"),
            Some(r.lease_stale),
        );
        one(
            "remediation.kdump_wait",
            key("kdump_wait"),
            Some(r.kdump_wait),
        );
        one(
            "remediation.auto_repair.unhealthy_for",
            key("auto_repair.unhealthy_for"),
            Some(r.auto_repair.unhealthy_for),
        );
        if let Some(s) = &r.auto_repair.sabakan {
            one(
                "remediation.auto_repair.sabakan.timeout",
                key("auto_repair.sabakan.timeout"),
                Some(s.timeout),
            );
        }
        for (i, hc) in r.health_checks.iter().enumerate() {
            one(
                "remediation.health_checks[].node_startup_timeout",
                key(&format!("health_checks[{i}].node_startup_timeout")),
                Some(hc.node_startup_timeout),
            );
            for (j, c) in hc.unhealthy_conditions.iter().enumerate() {
                one(
                    "remediation.health_checks[].unhealthy_conditions[].timeout",
                    key(&format!(
                        "health_checks[{i}].unhealthy_conditions[{j}].timeout"
                    )),
                    Some(c.timeout),
                );
            }
        }
        let l = &r.limits;
        one(
            "remediation.limits.slow_start.success_after",
            key("limits.slow_start.success_after"),
            Some(l.slow_start.success_after),
        );
        one(
            "remediation.limits.slow_start.lookback",
            key("limits.slow_start.lookback"),
            Some(l.slow_start.lookback),
        );
        one(
            "remediation.limits.correlated_failure.window",
            key("limits.correlated_failure.window"),
            Some(l.correlated_failure.window),
        );
        one(
            "remediation.limits.self_isolation.window",
            key("limits.self_isolation.window"),
            Some(l.self_isolation.window),
        );
        one(
            "remediation.limits.self_isolation.settle",
            key("limits.self_isolation.settle"),
            Some(l.self_isolation.settle),
        );
        one(
            "remediation.limits.escalation.window",
            key("limits.escalation.window"),
            Some(l.escalation.window),
        );
    }
    out
}

/// The first duration of `cfg` outside its range, as "key `…`: what is wrong".
pub(super) fn check(cfg: &Config) -> Result<(), String> {
    for (pattern, key, d) in settings(cfg) {
        RANGES.check(pattern, &key, d)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A config with every optional duration set, to its section's default where it has one.
    const EVERY_KEY: &str = r#"
listen = "127.0.0.1:7000"
database = "/tmp/x.db"
[tls]
ca = "ca.pem"
cert = "c.pem"
key = "k.pem"
[health]
unreachable_grace = "15s"
[fence.machine_types.big]
off_timeout = "1m"
on_timeout = "1m"
release_timeout = "1m"
back_timeout = "1m"
[fence.gateways.rack-1]
off_timeout = "2m"
on_timeout = "2m"
release_timeout = "2m"
back_timeout = "2m"
[[gateways.targets]]
name = "rack-1"
address = "127.0.0.1:1"
server_name = "localhost"
[kubernetes]
[kdump.timeout_by_machine_type]
big = "45m"
[remediation.auto_repair]
source = "sabakan"
[remediation.auto_repair.sabakan]
url = "http://127.0.0.1:1/graphql"
[[remediation.health_checks]]
name = "hc"
[[remediation.health_checks.unhealthy_conditions]]
type = "Ready"
status = "False"
timeout = "5m"
"#;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/c.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn every_duration_key_has_a_range_every_range_a_key_and_the_defaults_fit() {
        let cfg = parse(EVERY_KEY).unwrap();
        let found = settings(&cfg);
        for (pattern, _) in RANGES.0 {
            assert!(
                found.iter().any(|(p, _, _)| p == pattern),
                "{pattern} is in the table but not read from a config"
            );
        }
        check(&cfg).unwrap();
    }

    #[test]
    fn a_duration_past_its_range_is_refused_naming_the_key_and_the_range() {
        let base = EVERY_KEY.replace(
            "unreachable_grace = \"15s\"",
            "unreachable_grace = \"100000h\"",
        );
        let e = parse(&base).unwrap_err();
        assert!(
            e.contains("key `health.unreachable_grace`: 100000h is above the longest this setting takes (1h); use a value from 10ms to 1h"),
            "{e}"
        );
        for (from, to, key) in [
            (
                "[kubernetes]",
                "[kubernetes]\nrequest_timeout = \"2h\"",
                "kubernetes.request_timeout",
            ),
            (
                "big = \"45m\"",
                "big = \"1000h\"",
                "kdump.timeout_by_machine_type.big",
            ),
            (
                "release_timeout = \"1m\"",
                "release_timeout = \"25h\"",
                "fence.machine_types.big.release_timeout",
            ),
            (
                "timeout = \"5m\"",
                "timeout = \"48h\"",
                "remediation.health_checks[0].unhealthy_conditions[0].timeout",
            ),
            (
                "[remediation.auto_repair]",
                "[remediation]\ninterval = \"11m\"\n[remediation.auto_repair]",
                "remediation.interval",
            ),
            (
                "[remediation.auto_repair]",
                "[remediation]\njournal_retention = \"30s\"\n[remediation.auto_repair]",
                "remediation.journal_retention",
            ),
            (
                "[remediation.auto_repair]",
                "[remediation.limits.correlated_failure]\nwindow = \"2h\"\n[remediation.auto_repair]",
                "remediation.limits.correlated_failure.window",
            ),
            (
                "database = \"/tmp/x.db\"",
                "database = \"/tmp/x.db\"\nshutdown_grace = \"1h\"",
                "shutdown_grace",
            ),
            (
                "back_timeout = \"2m\"",
                "back_timeout = \"25h\"",
                "fence.gateways.rack-1.back_timeout",
            ),
        ] {
            let text = EVERY_KEY.replace(from, to);
            assert_ne!(text, EVERY_KEY, "{from}");
            let e = parse(&text).unwrap_err();
            assert!(
                e.contains(&format!("key `{key}`:")) && e.contains("use a value from"),
                "{key}: {e}"
            );
        }
    }

    #[test]
    fn operations_md_lists_every_range() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
        let doc = std::fs::read_to_string(path).unwrap();
        for (pattern, range) in RANGES.0 {
            let row = format!("| `{pattern}` | {range} |");
            assert!(doc.contains(&row), "docs/operations.md lacks the row {row}");
        }
    }
}
