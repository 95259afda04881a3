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
    let d = Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))?;
    if d > MAX {
        return Err(format!(
            "{s:?} is longer than a week: every limit of the gateway is at most \"168h\""
        ));
    }
    Ok(d)
}

/// The longest duration any setting takes: far above every sensible limit, and small
/// enough that no sum of settings added to a clock overflows it.
const MAX: Duration = Duration::from_secs(7 * 24 * 3600);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_a_week_are_refused_so_no_deadline_overflows() {
        assert_eq!(parse("168h").unwrap(), MAX);
        let e = parse("9999999999h").unwrap_err();
        assert!(
            e.contains("longer than a week") && e.contains("168h"),
            "{e}"
        );
        assert!(parse("169h").is_err());
        assert!(parse("30").unwrap_err().contains("has no unit"));
    }
}
