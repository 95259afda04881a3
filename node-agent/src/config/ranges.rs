//! Every duration of the agent's configuration with the range it accepts: one table
//! ([`RANGES`]) that start and reload apply and `node-agent/README.md` lists, so a typo such
//! as `command_timeout = "100000h"` is refused naming the key instead of leaving a hung
//! command running for years.

use std::time::Duration;

use protocol::duration::{Range, Ranges};
use protocol::messages::MAX_REPORT_INTERVAL;

/// 10 ms: the shortest period or limit the agent works with (tests run at a few hundred
/// milliseconds); shorter is a typo for seconds.
const SHORTEST: Duration = Duration::from_millis(10);

/// Every duration key and its range.
pub(crate) const RANGES: Ranges = Ranges(&[
    // The coordinator judges silence on the interval; past a minute a dead machine goes
    // unnoticed for minutes.
    ("report_interval", Range::new(SHORTEST, MAX_REPORT_INTERVAL)),
    // The kubelet's healthz answers from memory; a minute of silence is a wedged kubelet.
    (
        "kubelet.timeout",
        Range::new(SHORTEST, Duration::from_secs(60)),
    ),
    // A unit restart or a reboot command that has not returned within an hour will not.
    (
        "actions.command_timeout",
        Range::new(SHORTEST, Duration::from_secs(3600)),
    ),
]);

/// Parses `text` as the duration of `key`, refusing one outside its range.
pub(crate) fn parse(key: &str, text: &str) -> Result<Duration, String> {
    let d = protocol::duration::parse(text)?;
    let range = RANGES
        .of(key)
        .ok_or_else(|| format!("no range is defined for {key} (a bug)"))?;
    range.check(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_their_range_are_refused_and_the_readme_lists_each_range() {
        let e = parse("actions.command_timeout", "100000h").unwrap_err();
        assert!(
            e.contains("100000h is above the longest this setting takes (1h)"),
            "{e}"
        );
        assert!(
            parse("kubelet.timeout", "0s")
                .unwrap_err()
                .contains("below")
        );
        assert_eq!(parse("kubelet.timeout", "1m"), Ok(Duration::from_secs(60)));
        let readme = include_str!("../../README.md");
        for (key, range) in RANGES.0 {
            let row = format!("| `{key}` | {range} |");
            assert!(readme.contains(&row), "node-agent/README.md lacks {row}");
        }
    }
}
