//! Serde helpers for duration strings (`"30s"`, `"250ms"`, `"1m 30s"`), written like the
//! coordinator's: a bare number is refused with a message that says to add a unit.

use std::time::Duration;

use serde::Deserialize;

/// Parses a non-negative duration string; a bare number is refused (its unit would be a
/// guess).
pub(super) fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.parse::<f64>().is_ok() {
        return Err(bare_number(t));
    }
    let d: jiff::SignedDuration = t
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like \"5s\", \"500ms\" or \"1m 30s\""))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))
}

fn bare_number(n: &str) -> String {
    format!(
        "{n} has no unit: durations are strings with a unit, like \"{n}s\", \"{n}ms\" or \"{n}m\""
    )
}

/// A duration as written in the file: a string, or (refused) a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Text(String),
    Int(i64),
    Float(f64),
}

pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    match Written::deserialize(d)? {
        Written::Text(s) => parse(&s).map_err(serde::de::Error::custom),
        Written::Int(n) => Err(serde::de::Error::custom(bare_number(&n.to_string()))),
        Written::Float(n) => Err(serde::de::Error::custom(bare_number(&n.to_string()))),
    }
}
