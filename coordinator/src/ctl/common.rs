//! What every `coordinatorctl` command group shares: the context a command runs with, the
//! [`CommandGroup`] trait, and table and time formatting.
//!
//! Groups import from here, never from the CLI's root module, so the root can list the
//! groups without a cycle.

use std::future::Future;

use super::client::{AdminClient, ConnectArgs};

/// What a command group gets to run.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Connection settings (used only by commands that connect).
    pub connect: ConnectArgs,
}

impl Ctx {
    /// Connects to the coordinator with an admin certificate.
    pub async fn client(&self) -> anyhow::Result<AdminClient> {
        AdminClient::connect(&self.connect).await
    }
}

/// A connection for commands that poll for long (`repair-queue wait`, `events --follow`):
/// when the coordinator goes away (a restart, an upgrade, a crash: the connection closed, or
/// no answer within `--timeout`) it says so on stderr and connects
/// again, once a second, instead of ending the command; the requests it is used for only
/// read, so asking again is harmless. The first connection is made as for any command, so
/// a wrong address still fails at once.
pub struct Polling<'a> {
    ctx: &'a Ctx,
    client: Option<AdminClient>,
    /// While the coordinator is away: when to say again that it still is.
    away: Option<Reminder>,
}

/// When to remind a person watching a poll that the coordinator is still away: 10 s after it
/// went, then every minute, so that a command without a time limit is never silent for long.
#[derive(Debug, Clone, Copy)]
struct Reminder {
    since: tokio::time::Instant,
    next: tokio::time::Instant,
}

impl Reminder {
    const FIRST: std::time::Duration = std::time::Duration::from_secs(10);
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    fn new(now: tokio::time::Instant) -> Self {
        Self {
            since: now,
            next: now + Self::FIRST,
        }
    }

    /// How long the coordinator has been away, when a reminder is due at `now`.
    fn due(&mut self, now: tokio::time::Instant) -> Option<std::time::Duration> {
        if now < self.next {
            return None;
        }
        self.next = now + Self::EVERY;
        Some(now - self.since)
    }
}

impl<'a> Polling<'a> {
    /// Connects.
    pub async fn connect(ctx: &'a Ctx) -> anyhow::Result<Self> {
        Ok(Self {
            ctx,
            client: Some(ctx.client().await?),
            away: None,
        })
    }

    /// Sends `req`, reconnecting while the connection is lost, until `until` (if any) has
    /// passed: then the last error.
    pub async fn request(
        &mut self,
        req: &protocol::admin::AdminRequest,
        until: Option<tokio::time::Instant>,
    ) -> anyhow::Result<protocol::admin::AdminResponse> {
        let past = || until.is_some_and(|u| tokio::time::Instant::now() >= u);
        loop {
            let client = match self.client.take() {
                Some(c) => c,
                None => match bounded(until, self.ctx.client()).await {
                    Ok(c) => {
                        self.away = None;
                        eprintln!("coordinatorctl: connected to the coordinator again");
                        c
                    }
                    Err(e) if past() => return Err(e),
                    Err(e) => {
                        let now = tokio::time::Instant::now();
                        let away = self.away.get_or_insert_with(|| Reminder::new(now));
                        if let Some(for_) = away.due(now) {
                            eprintln!(
                                "coordinatorctl: still no coordinator after {}s ({e:#}); trying again every second{}",
                                for_.as_secs(),
                                if until.is_none() {
                                    " (no time limit: Ctrl-C stops)"
                                } else {
                                    ""
                                }
                            );
                        }
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                        continue;
                    }
                },
            };
            let answer = client.request(req).await;
            // A coordinator killed outright (kill -9, a crash) closes nothing: its connection
            // just goes silent, so no answer counts as losing it too.
            let silent = answer
                .as_ref()
                .err()
                .and_then(|e| e.downcast_ref::<super::client::NoAnswer>())
                .map(|_| "no answer within --timeout".to_string());
            let why = match (&answer, client.lost().or(silent)) {
                // An answer, or a refusal on a connection that is still open.
                (Ok(_), _) | (Err(_), None) => {
                    self.client = Some(client);
                    return answer;
                }
                (Err(_), Some(_)) if past() => return answer,
                (Err(_), Some(why)) => why,
            };
            eprintln!("coordinatorctl: lost the coordinator ({why}); connecting again");
            self.away = Some(Reminder::new(tokio::time::Instant::now()));
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
    }

    /// Closes the connection politely.
    pub async fn close(self) {
        if let Some(c) = self.client {
            c.close().await;
        }
    }
}

/// `f`, cut off at `until`.
async fn bounded<T>(
    until: Option<tokio::time::Instant>,
    f: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match until {
        None => f.await,
        Some(u) => tokio::time::timeout_at(u, f)
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the coordinator did not answer in time"))),
    }
}

/// Pause between attempts to reach a coordinator that went away.
const RECONNECT_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// A group of subcommands.
pub trait CommandGroup {
    /// Runs the chosen command.
    fn run(self, ctx: &Ctx) -> impl Future<Output = anyhow::Result<()>>;
}

/// An error and its causes on one line, `a: b: c`, leaving out a cause the line already
/// says (many errors quote their cause in their own message, and `{:#}` would print it twice).
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !line.contains(&c) {
            line.push_str(": ");
            line.push_str(&c);
        }
    }
    line
}

/// Formats a Unix-millisecond time as RFC 3339 (seconds) for tables.
pub fn fmt_time(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(0))
        .map(|t| {
            // Cut down, not rounded: a time is never shown later than it happened (a
            // power-off confirmed at :32.6 would otherwise read :33, after a step at :33.1).
            t.round(
                jiff::TimestampRound::new()
                    .smallest(jiff::Unit::Second)
                    .mode(jiff::RoundMode::Trunc),
            )
            .map(|t| t.to_string())
            .unwrap_or_default()
        })
        .unwrap_or_else(|_| "-".into())
}

/// Formats how long ago a Unix-millisecond time was: `12s`, `5m`, `3h`, `2d`.
pub fn fmt_age(ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(ms) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `s` as a terminal may show it: each control character (a newline, a tab, an escape that
/// would start a terminal sequence) written as its Rust escape (`\n`, `\u{1b}`). Text from
/// agents (check details) and from other admins reaches tables and lines as it was sent.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// The widest a column is padded to. A longer cell (an inventory field stored before the
/// coordinator limited them, a long check detail) is still shown whole, but does not widen
/// its column for every other row: its own row is pushed right instead, so one odd value
/// does not turn the whole table into blank space.
pub const MAX_COLUMN_WIDTH: usize = 80;

/// Prints rows as a left-aligned table with a header. Control characters in a cell are
/// shown escaped ([`shown`]). Every cell is shown whole, whatever its length (`--json`
/// gives the same values to scripts); columns are padded by hand to at most
/// [`MAX_COLUMN_WIDTH`] characters.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| shown(c).into_owned()).collect())
        .collect();
    for line in table_lines(header, &rows) {
        println!("{line}");
    }
}

/// The lines of [`print_table`], cells as given. Padding is written by hand, not with a
/// format width: `format!`'s width is at most 65535 and panics past it.
fn table_lines(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                let len = c.chars().count();
                if len <= MAX_COLUMN_WIDTH {
                    *w = (*w).max(len);
                }
            }
        }
    }
    let line = |cells: &[&str]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            s.push_str(c);
            if i + 1 < cells.len() {
                let w = widths.get(i).copied().unwrap_or(0);
                let pad = w.saturating_sub(c.chars().count()) + 2;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.truncate(s.trim_end().len());
        s
    };
    let mut lines = vec![line(header)];
    for r in rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        lines.push(line(&cells));
    }
    lines
}

/// A Unix-millisecond time as scripts get it in `--json`: RFC 3339, UTC, milliseconds
/// (`2026-11-23T06:35:12.345Z`).
pub fn rfc3339_ms(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX))
        .map(|t| format!("{t:.3}"))
        .unwrap_or_else(|_| ms.to_string())
}

/// The name a `*_unix_ms` field has in `--json`: the suffix goes, and a name that does not
/// already say it is a time (`at`, `…_at`, `…since`, `…time`) gets `_at`
/// (`last_report_unix_ms` → `last_report_at`, `state_since_unix_ms` → `state_since`).
fn time_key(base: &str) -> String {
    if base == "at" || base.ends_with("_at") || base.ends_with("since") || base.ends_with("time") {
        base.to_string()
    } else {
        format!("{base}_at")
    }
}

/// `[[k, v], …]` when every element is a two-element array whose first is a string.
fn pairs(v: &[serde_json::Value]) -> Option<Vec<(String, serde_json::Value)>> {
    v.iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([serde_json::Value::String(k), v]) => Some((k.clone(), v.clone())),
            _ => None,
        })
        .collect()
}

/// Rewrites what the admin API's types serialize to into what scripts want, recursively:
/// `*_unix_ms` integers become RFC 3339 strings under the name [`time_key`] gives them
/// (0, "never", becomes null); `labels` lists of pairs become objects; `failing_since`
/// (check, time) pairs become an object of times; `paused` (reason, since) becomes
/// `{reason, since}`. Anything else is left as it is.
pub fn script_value(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let time = |v: Value| match v.as_u64() {
        Some(0) => Value::Null,
        Some(ms) => Value::String(rfc3339_ms(ms)),
        None => v,
    };
    match v {
        Value::Array(a) => Value::Array(a.into_iter().map(script_value).collect()),
        Value::Object(o) => {
            let mut out = serde_json::Map::with_capacity(o.len());
            for (k, v) in o {
                let (k, v) = match (k.as_str(), v) {
                    (k, v) if k.ends_with("_unix_ms") => {
                        (time_key(k.trim_end_matches("_unix_ms")), time(v))
                    }
                    ("labels", Value::Array(a)) if pairs(&a).is_some() => {
                        let m = pairs(&a).unwrap_or_default().into_iter().collect();
                        (k.to_string(), Value::Object(m))
                    }
                    ("failing_since", Value::Array(a)) if pairs(&a).is_some() => {
                        let m = pairs(&a)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(c, t)| (c, time(t)))
                            .collect();
                        (k.to_string(), Value::Object(m))
                    }
                    ("paused", Value::Array(a)) if a.len() == 2 && a[0].is_string() => {
                        let mut it = a.into_iter();
                        let reason = it.next().unwrap_or_default();
                        let since = time(it.next().unwrap_or_default());
                        (
                            k.to_string(),
                            serde_json::json!({"reason": reason, "since": since}),
                        )
                    }
                    (k, v) => (k.to_string(), script_value(v)),
                };
                out.insert(k, v);
            }
            Value::Object(out)
        }
        other => other,
    }
}

/// Prints `v` as `--json` prints: pretty, with [`script_value`]'s types.
pub fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(&script_value(serde_json::to_value(v)?))?
    );
    Ok(())
}

/// For a command that takes flags, not subcommands (`events`, `status`): clap's group list
/// wants a subcommand type, so this adds the flags of `$args` (an `Args` type) to the
/// command itself.
macro_rules! flags_only_command {
    ($args:ty) => {
        impl clap::Subcommand for $args {
            fn augment_subcommands(cmd: clap::Command) -> clap::Command {
                <Self as clap::Args>::augment_args(
                    cmd.subcommand_required(false).arg_required_else_help(false),
                )
            }

            fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
                <Self as clap::Args>::augment_args_for_update(
                    cmd.subcommand_required(false).arg_required_else_help(false),
                )
            }

            fn has_subcommand(_name: &str) -> bool {
                false
            }
        }
    };
}
pub(crate) use flags_only_command;

#[cfg(test)]
mod tests {

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(shown("plain text ü"), "plain text ü");
        assert!(matches!(shown("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(shown("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(shown("red \u{1b}[31m"), "red \\u{1b}[31m");
    }

    use protocol::admin::machines::{MachineDetail, MachineSpec, MachineSummary};
    use protocol::admin::remediation::RemediationStatus;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_error_line_says_each_cause_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let inner = crate::inventory::InventoryError::Read {
            path: "/x.toml".into(),
            source: io,
        };
        let e = anyhow::Error::new(inner).context("cannot import /x.toml");
        let line = error_line(&e);
        assert_eq!(
            line,
            "cannot import /x.toml: cannot read inventory /x.toml: entity not found"
        );
        let plain = anyhow::anyhow!("a").context("b");
        assert_eq!(error_line(&plain), "b: a");
    }

    #[test]
    fn tables_pad_by_hand_and_show_long_cells_whole() {
        let long = "t".repeat(100_000);
        let rows = vec![
            vec!["10.0.0.1".to_string(), long.clone(), "ok".to_string()],
            vec!["10.0.0.2".to_string(), "qemu".to_string(), "ok".to_string()],
        ];
        // A width past 65535 made `format!` panic ("Formatting argument out of range").
        let lines = table_lines(&["ADDRESS", "TYPE", "STATE"], &rows);
        assert_eq!(lines[0], "ADDRESS   TYPE  STATE");
        assert_eq!(lines[1], format!("10.0.0.1  {long}  ok"), "shown whole");
        assert_eq!(
            lines[2], "10.0.0.2  qemu  ok",
            "a cell past the widest column does not widen it for the others"
        );
        let wide = "w".repeat(MAX_COLUMN_WIDTH);
        let lines = table_lines(
            &["A", "B"],
            &[vec![wide.clone(), "x".into()], vec!["é".into(), "y".into()]],
        );
        assert_eq!(lines[1], format!("{wide}  x"));
        assert_eq!(
            lines[2],
            format!("é{}  y", " ".repeat(MAX_COLUMN_WIDTH - 1))
        );
        assert_eq!(
            table_lines(&["A", "B"], &[vec!["a".into()]])[1],
            "a",
            "a short row"
        );
    }

    #[test]
    fn table_times_are_cut_down_to_the_second() {
        // 2026-11-24T09:21:32.644Z: shown as :32, never as the :33 it is nearer to.
        assert_eq!(fmt_time(1_795_512_092_644), "2026-11-24T09:21:32Z");
        assert_eq!(fmt_time(1_795_512_092_000), "2026-11-24T09:21:32Z");
        assert_eq!(fmt_time(1_795_512_092_999), "2026-11-24T09:21:32Z");
    }

    #[test]
    fn a_coordinator_away_is_mentioned_after_ten_seconds_then_every_minute() {
        let t0 = tokio::time::Instant::now();
        let s = std::time::Duration::from_secs;
        let mut r = Reminder::new(t0);
        assert_eq!(r.due(t0 + s(9)), None);
        assert_eq!(r.due(t0 + s(10)), Some(s(10)));
        assert_eq!(r.due(t0 + s(11)), None);
        assert_eq!(r.due(t0 + s(69)), None);
        assert_eq!(r.due(t0 + s(71)), Some(s(71)));
        assert_eq!(r.due(t0 + s(100)), None);
    }

    fn summary() -> MachineSummary {
        MachineSummary {
            spec: MachineSpec {
                address: "10.0.0.1".into(),
                hostname: "n1".into(),
                serial: "S1".into(),
                rack: "r1".into(),
                role: "cs".into(),
                machine_type: "qemu".into(),
                labels: vec![("zone".into(), "a".into()), ("pool".into(), "gpu".into())],
            },
            state: "healthy".into(),
            state_since_unix_ms: 1_795_414_698_418,
            failing: vec![],
            reason: String::new(),
            last_report_unix_ms: None,
            connected: true,
        }
    }

    #[test]
    fn times_become_rfc3339_with_milliseconds_and_labels_a_map() {
        let d = MachineDetail {
            summary: summary(),
            last_report: None,
            last_report_unix_ms: Some(1_795_414_698_000),
            transitions: vec![],
            boot_id: None,
            agent_version: None,
            healthy_since_unix_ms: None,
            failing_since: vec![("nic:eth0".into(), 1_795_414_698_001)],
            kdump: None,
        };
        let v = script_value(serde_json::to_value(&d).unwrap());
        assert_eq!(v["summary"]["state_since"], "2026-11-23T06:18:18.418Z");
        assert_eq!(v["last_report_at"], "2026-11-23T06:18:18.000Z");
        assert_eq!(v["summary"]["last_report_at"], json!(null));
        assert_eq!(
            v["summary"]["spec"]["labels"],
            json!({"zone": "a", "pool": "gpu"})
        );
        assert_eq!(
            v["failing_since"],
            json!({"nic:eth0": "2026-11-23T06:18:18.001Z"})
        );
        assert!(!v.to_string().contains("unix_ms"), "{v}");
        let s = RemediationStatus {
            paused: Some(("maintenance".into(), 1_795_414_698_418)),
            last_pass_unix_ms: Some(1_795_414_698_418),
            ..RemediationStatus::default()
        };
        let v = script_value(serde_json::to_value(&s).unwrap());
        assert_eq!(
            v["paused"],
            json!({"reason": "maintenance", "since": "2026-11-23T06:18:18.418Z"})
        );
        assert_eq!(v["last_pass_at"], "2026-11-23T06:18:18.418Z");
        assert_eq!(v["outage_confirmed_at"], json!(null));
    }

    #[test]
    fn time_keys_say_they_are_times() {
        for (base, key) in [
            ("at", "at"),
            ("first", "first_at"),
            ("last_report", "last_report_at"),
            ("state_since", "state_since"),
            ("last_transition_time", "last_transition_time"),
            ("collected", "collected_at"),
        ] {
            assert_eq!(time_key(base), key);
        }
    }
}
