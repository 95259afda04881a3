//! Durations as people write them in the agent's and the gateway's flags and files, and as
//! messages print them.
//!
//! [`parse`] takes a number with a unit (`500ms`, `5s`, `1.5s`, `2m`, `1h`), or several
//! (`1m30s`, `1m 30s`). A bare number is refused: its unit would be a guess, and a `5` meant
//! as seconds but read as milliseconds is an outage. (The coordinator's configuration also
//! accepts ISO 8601 durations, through jiff, which the small binaries do not link.)
//!
//! [`display`] rounds to the millisecond, so a deadline's remainder prints as `2s`, not
//! `1.99999923s`.

use std::time::Duration;

/// Parses `500ms`, `5s`, `1.5s`, `2m`, `1h`, or a sum of such terms (`1m30s`, `1m 30s`).
/// The error says what is wrong with `s`, quoting it.
pub fn parse(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("an empty string is not a duration; write e.g. 5s, 500ms or 1m".into());
    }
    if text.parse::<f64>().is_ok() {
        return Err(format!(
            "{text:?} has no unit: durations are strings with a unit, like \"{text}s\" or \"{text}ms\""
        ));
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("{text:?} is not a duration; write e.g. 5s, 500ms or 1m"))?;
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "{num:?} in {text:?} has no unit: use ms, s, m or h"
                ));
            }
            other => {
                return Err(format!(
                    "unknown unit {other:?} in {text:?}; use ms, s, m or h"
                ));
            }
        };
        total += n * scale;
        rest = after.trim_start();
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("{text:?}: {e}"))
}

/// [`parse`] for a time limit on the command line (`--timeout`): zero is refused, since
/// nothing can answer within it and every request would fail as "timed out".
pub fn limit(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d.is_zero() {
        return Err(format!(
            "{:?} is no time at all: a time limit must be above zero, e.g. 15s",
            s.trim()
        ));
    }
    Ok(d)
}

/// Serde `deserialize_with` for an optional duration in a file, kept as text for [`parse`]
/// (use with `#[serde(default)]`): a number (`report_interval = 5`) is refused saying that
/// it has no unit, where serde alone would say "invalid type: integer 5, expected a string".
pub fn text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration string with a unit, like \"5s\"")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(Some(s.to_string()))
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
            Err(E::custom(bare(&n.to_string())))
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
            Err(E::custom(bare(&n.to_string())))
        }
        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Self::Value, E> {
            Err(E::custom(bare(&n.to_string())))
        }
    }
    d.deserialize_any(Text)
}

/// The message for a number without a unit.
fn bare(text: &str) -> String {
    format!(
        "{text} has no unit: durations are strings with a unit, like \"{text}s\" or \"{text}ms\""
    )
}

/// `d` for a message, rounded to the millisecond: `250ms`, `2s`, `1.5s`, `90s` (below a
/// millisecond, as it is: `400µs`).
pub fn display(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        return format!("{d:?}");
    }
    let ms = (d.as_nanos() + 500_000) / 1_000_000;
    let rounded = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
    format!("{rounded:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_decimals_and_sums() {
        let cases = [
            ("500ms", 500),
            ("5s", 5_000),
            ("1.5s", 1_500),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1m30s", 90_000),
            (" 1m 30s ", 90_000),
            ("0s", 0),
        ];
        for (text, ms) in cases {
            assert_eq!(parse(text), Ok(Duration::from_millis(ms)), "{text}");
        }
    }

    #[test]
    fn refuses_bare_numbers_unknown_units_and_junk_naming_them() {
        let e = parse("7").unwrap_err();
        assert!(e.contains("has no unit") && e.contains("\"7s\""), "{e}");
        let e = parse("5d").unwrap_err();
        assert!(e.contains("unknown unit \"d\""), "{e}");
        let e = parse("1m30").unwrap_err();
        assert!(e.contains("\"30\" in \"1m30\" has no unit"), "{e}");
        for junk in ["", "s", "xyz", "1..5s", "-5s"] {
            assert!(parse(junk).is_err(), "{junk:?} parsed");
        }
    }

    #[test]
    fn a_time_limit_of_zero_is_refused() {
        let e = limit("0s").unwrap_err();
        assert!(e.contains("\"0s\" is no time at all"), "{e}");
        assert!(limit("0ms").is_err());
        assert_eq!(limit("1ms").unwrap(), Duration::from_millis(1));
        assert!(limit("5").unwrap_err().contains("has no unit"));
    }

    #[test]
    fn a_number_in_a_file_is_said_to_have_no_unit() {
        #[derive(Debug, serde::Deserialize)]
        struct File {
            #[serde(default, deserialize_with = "text")]
            every: Option<String>,
        }
        let read = |json: &str| serde_json::from_str::<File>(json).map(|f| f.every);
        assert_eq!(read(r#"{"every": "5s"}"#).unwrap().as_deref(), Some("5s"));
        assert_eq!(read("{}").unwrap(), None);
        let e = read(r#"{"every": 5}"#).unwrap_err().to_string();
        assert!(e.contains("5 has no unit") && e.contains("\"5s\""), "{e}");
        let e = read(r#"{"every": 1.5}"#).unwrap_err().to_string();
        assert!(e.contains("1.5 has no unit"), "{e}");
        let e = read(r#"{"every": true}"#).unwrap_err().to_string();
        assert!(e.contains("a duration string with a unit"), "{e}");
    }

    #[test]
    fn displays_to_the_millisecond() {
        assert_eq!(display(Duration::from_nanos(1_999_999_230)), "2s");
        assert_eq!(display(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(display(Duration::from_millis(250)), "250ms");
        assert_eq!(display(Duration::from_micros(400)), "400µs");
        assert_eq!(display(Duration::from_micros(1_400)), "1ms");
    }
}
