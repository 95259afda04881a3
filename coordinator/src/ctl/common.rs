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

/// A group of subcommands.
pub trait CommandGroup {
    /// Runs the chosen command.
    fn run(self, ctx: &Ctx) -> impl Future<Output = anyhow::Result<()>>;
}

/// Formats a Unix-millisecond time as RFC 3339 (seconds) for tables.
pub fn fmt_time(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(0))
        .map(|t| {
            t.round(jiff::Unit::Second)
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

/// Prints rows as a left-aligned table with a header.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}
