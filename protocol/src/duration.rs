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

/// The durations one setting accepts, both ends included. Every duration in the fleet's
/// configuration files has one, so a typo such as `"100000h"` (a dead machine never judged
/// unreachable) is refused at `check` and start instead of silently disabling what the
/// setting drives. Each program keeps its settings' ranges in one table ([`Ranges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The shortest accepted duration.
    pub min: Duration,
    /// The longest accepted duration.
    pub max: Duration,
}

impl Range {
    /// From `min` to `max`, both included.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// `d`, or why it is outside the range and what to write instead.
    pub fn check(&self, d: Duration) -> Result<Duration, String> {
        if d < self.min {
            return Err(format!(
                "{} is below the shortest this setting takes ({}); use a value from {self}",
                short(d),
                short(self.min)
            ));
        }
        if d > self.max {
            return Err(format!(
                "{} is above the longest this setting takes ({}); use a value from {self}",
                short(d),
                short(self.max)
            ));
        }
        Ok(d)
    }
}

impl std::fmt::Display for Range {
    /// `10ms to 1m`, the form the documentation uses.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} to {}", short(self.min), short(self.max))
    }
}

/// `d` in its largest whole unit, as people write it in a file: `0s`, `10ms`, `90s`, `1m`,
/// `6h`, `2160h` (hours are the largest unit the fleet's files take); below a millisecond
/// as it is (`400µs`).
pub fn short(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{d:?}");
    }
    let ms = d.as_millis();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// One program's table of duration settings: each dotted key (a `*` stands for a table's
/// name or a list's index) with its [`Range`]. The one place a program's duration limits
/// are kept, documented and checked.
#[derive(Debug, Clone, Copy)]
pub struct Ranges(pub &'static [(&'static str, Range)]);

impl Ranges {
    /// The range of `pattern`, the key as the table spells it (`fence.gateways.*.on_timeout`).
    pub fn of(&self, pattern: &str) -> Option<Range> {
        self.0.iter().find(|(k, _)| *k == pattern).map(|(_, r)| *r)
    }

    /// `d` if it is within `pattern`'s range; else the message, naming `key` (the key as the
    /// file spells it, `fence.gateways.rack-1.on_timeout`). A pattern missing from the table
    /// is refused too, so a setting added without a range fails its first test.
    pub fn check(&self, pattern: &str, key: &str, d: Duration) -> Result<Duration, String> {
        let range = self.of(pattern).ok_or_else(|| {
            format!("key `{key}`: no range is defined for it (a bug: add {pattern:?} to the table)")
        })?;
        range.check(d).map_err(|e| format!("key `{key}`: {e}"))
    }
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
    fn a_duration_outside_its_range_is_refused_naming_the_key_and_the_range() {
        const T: Ranges = Ranges(&[(
            "a.*.grace",
            Range::new(Duration::from_millis(10), Duration::from_secs(3600)),
        )]);
        let ok = T.check("a.*.grace", "a.x.grace", Duration::from_secs(3600));
        assert_eq!(ok, Ok(Duration::from_secs(3600)));
        let e = T
            .check(
                "a.*.grace",
                "a.x.grace",
                Duration::from_secs(100_000 * 3600),
            )
            .unwrap_err();
        assert!(
            e.starts_with("key `a.x.grace`: 100000h is above the longest")
                && e.contains("(1h)")
                && e.contains("from 10ms to 1h"),
            "{e}"
        );
        let e = T
            .check("a.*.grace", "a.x.grace", Duration::ZERO)
            .unwrap_err();
        assert!(
            e.contains("0s is below the shortest") && e.contains("(10ms)"),
            "{e}"
        );
        let e = T.check("b", "b", Duration::ZERO).unwrap_err();
        assert!(e.contains("no range is defined"), "{e}");
    }

    #[test]
    fn short_writes_the_largest_whole_unit() {
        let cases = [(0, "0s"), (10, "10ms"), (1_500, "1500ms"), (90_000, "90s")];
        for (ms, text) in cases {
            assert_eq!(short(Duration::from_millis(ms)), text);
        }
        assert_eq!(short(Duration::from_secs(60)), "1m");
        assert_eq!(short(Duration::from_secs(90 * 24 * 3600)), "2160h");
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
