//! Durations as the coordinator's configuration writes them: strings in jiff's friendly
//! (`"5s"`, `"1m 30s"`) or ISO 8601 (`"PT5S"`) form, with serde helpers for every area's
//! section (`#[serde(with = "crate::duration")]`, [`opt`] for optional keys) and the parser
//! `coordinatorctl` uses for `--timeout`.
//!
//! Every area's configuration uses it, so it lives apart from [`crate::config`], which only
//! assembles the sections: an area imports this module, never `config`. It parses only; the
//! range each key accepts is `config`'s table.

use std::time::Duration;

use jiff::SignedDuration;
use serde::Deserialize;

/// Parses a non-negative duration string. A bare number is refused: its unit would be
/// a guess.
pub fn parse(s: &str) -> Result<Duration, String> {
    if !s.trim().is_empty() && s.trim().parse::<f64>().is_ok() {
        return Err(bare_number(s.trim()));
    }
    let d: SignedDuration = s
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like \"5s\", \"500ms\" or \"1m 30s\""))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))
}

/// [`parse`] for a time limit on the command line (`--timeout`): zero is refused,
/// since nothing can answer within it and every request would fail as "timed out".
pub fn limit(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d.is_zero() {
        return Err(format!(
            "{:?} is no time at all: a time limit must be above zero, e.g. 30s",
            s.trim()
        ));
    }
    Ok(d)
}

/// The error for a duration written without a unit.
pub fn bare_number(n: &str) -> String {
    format!(
        "{n} has no unit: durations are strings with a unit, like \"{n}s\", \"{n}ms\" or \"{n}m\""
    )
}

/// A duration as written in a file: a string, or (refused with a clear message) a
/// number.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Written {
    /// A string: parsed.
    Text(String),
    /// A number: refused, its unit would be a guess.
    Int(i64),
    /// A number: refused, its unit would be a guess.
    Float(f64),
}

impl Written {
    /// The duration, or what is wrong with it.
    pub(crate) fn duration(self) -> Result<Duration, String> {
        match self {
            Written::Text(s) => parse(&s),
            Written::Int(n) => Err(bare_number(&n.to_string())),
            Written::Float(n) => Err(bare_number(&n.to_string())),
        }
    }
}

/// Deserializes a duration string; a bare number is an error saying to add a unit.
pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    Written::deserialize(d)?
        .duration()
        .map_err(serde::de::Error::custom)
}

/// Serde helpers for optional duration strings.
pub mod opt {
    use std::time::Duration;

    /// Deserializes an optional duration string.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::deserialize(d).map(Some)
    }
}
