//! `[remediation.limits]`: the storm limits' settings and their defaults, each with its
//! reason. Parsed as part of [`super::config::RemediationConfig`], which re-exports them and
//! validates them with the rest.

use std::time::Duration;

use serde::Deserialize;

use crate::duration;

/// `[remediation.limits]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Fleet-wide cap on repairs in flight.
    pub fleet_cap: FleetCap,
    /// Slow start per failure domain.
    pub slow_start: SlowStart,
    /// Correlated failure in one domain.
    pub correlated_failure: Correlated,
    /// Self-isolation: most agents silent at once.
    pub self_isolation: SelfIsolation,
    /// Rate of disruptive remediations.
    pub rate: Rate,
    /// Escalation bound per machine.
    pub escalation: Escalation,
}

/// At most `min(count, percent of the fleet)` repairs in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetCap {
    /// Binds in a large fleet, where a percentage would allow hundreds at once.
    pub count: u32,
    /// Binds in a small fleet (never below one machine).
    pub percent: u32,
}

impl Default for FleetCap {
    fn default() -> Self {
        // 10 at once is a rack's worth of drains; 5 % keeps a 40-machine cluster at 2.
        Self {
            count: 10,
            percent: 5,
        }
    }
}

/// Per-domain width: 1, doubling per confirmed success, back to 1 on a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlowStart {
    /// Starting width. One: the first repair in a domain proves the procedure works there.
    pub width: u32,
    /// Largest width. Eight drains at once is as much as one rack's spare capacity takes.
    pub max_width: u32,
    /// A success counts once the machine stayed healthy this long after its repair.
    #[serde(with = "duration")]
    pub success_after: Duration,
    /// How far back repair outcomes count.
    #[serde(with = "duration")]
    pub lookback: Duration,
}

impl Default for SlowStart {
    fn default() -> Self {
        Self {
            width: 1,
            max_width: 8,
            // Five minutes outlasts a kubelet crash loop's backoff, so a relapse shows.
            success_after: Duration::from_secs(300),
            // A day: yesterday's successes say little about today's failure.
            lookback: Duration::from_secs(24 * 3600),
        }
    }
}

/// `machines` or more of one domain failing within `window` is an infrastructure event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Correlated {
    /// Three: two machines of a rack failing together happens; three is a switch or a PDU.
    pub machines: u32,
    /// A minute: a rack that loses power loses its machines within seconds.
    #[serde(with = "duration")]
    pub window: Duration,
}

impl Default for Correlated {
    fn default() -> Self {
        Self {
            machines: 3,
            window: Duration::from_secs(60),
        }
    }
}

/// More than `percent` of all agents (and at least `min_silent`) silent within `window`:
/// the coordinator suspects its own network and admits nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelfIsolation {
    /// 30 %: more than any single rack or switch of a real fleet, far less than "all".
    pub percent: u32,
    /// Two silent agents are ordinary failures even in a tiny fleet.
    pub min_silent: u32,
    /// A partition silences every agent within one or two report intervals.
    #[serde(with = "duration")]
    pub window: Duration,
    /// A silent machine is not remediated before it has been unreachable this long, so
    /// that the agents silenced with it (a partition, a dark rack) have turned unreachable
    /// too and the burst is seen whole. Two report intervals at the default 5 s.
    #[serde(with = "duration")]
    pub settle: Duration,
}

impl Default for SelfIsolation {
    fn default() -> Self {
        Self {
            percent: 30,
            min_silent: 3,
            window: Duration::from_secs(60),
            settle: Duration::from_secs(10),
        }
    }
}

/// Admitted remediations per hour. Every remediation counts as disruptive: its procedure
/// may reboot, power-cycle or fence, and the core cannot see which step will.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rate {
    /// Fleet-wide: 20 an hour keeps a broken detector from cycling a fleet in an afternoon.
    pub per_hour: u32,
    /// Per domain: 5 an hour, a quarter of a 20-machine rack.
    pub per_domain_per_hour: u32,
}

impl Default for Rate {
    fn default() -> Self {
        Self {
            per_hour: 20,
            per_domain_per_hour: 5,
        }
    }
}

/// At most `max_remediations` per machine within `window`; past it, `needs-human`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Escalation {
    /// Three: a reboot, a power cycle and a fence, then a person.
    pub max_remediations: u32,
    /// A day, so a weekly flake is repaired but a daily loop is not.
    #[serde(with = "duration")]
    pub window: Duration,
}

impl Default for Escalation {
    fn default() -> Self {
        Self {
            max_remediations: 3,
            window: Duration::from_secs(24 * 3600),
        }
    }
}
