//! What a kubelet's Lease says about its machine: how long it has gone unrenewed, and which
//! rule makes a stale Lease the second signal of death ([`SecondSignal`]). Pure: the node
//! view and the release pass read the cluster and bring the facts here.
//!
//! A Lease's `renewTime` is written by the kubelet, with the kubelet's clock. Compared with
//! the coordinator's clock it says how long ago the kubelet last renewed, unless the two
//! clocks disagree: a kubelet whose clock runs 30 s behind looks 30 s stale while it renews
//! every 10 s. The node lifecycle controller is immune to that because it never compares
//! clocks: it notes, with its own clock, when it saw the Lease change. The coordinator does
//! both: the view notes when it first saw each `renewTime` value, and a Lease is as old as
//! the younger of the two ages ([`lease_age`]). A Lease that renews is then never stale,
//! whatever the kubelet's clock says, at the cost of up to one view refresh of delay when
//! the clocks agree.
//!
//! This module does not read or write the cluster, and decides nothing about releasing.

use std::time::Duration;

use jiff::Timestamp;
use serde::Deserialize;

/// What must join the agent's silence for a machine to count as dead (configuration key
/// `remediation.second_signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SecondSignal {
    /// The kubelet Lease unrenewed for `lease_stale` **and** the Node's Ready condition not
    /// True: the node lifecycle controller agrees, after its grace period (50 s by default).
    /// A release of the workload also waits for Ready to leave True.
    #[default]
    LeaseAndReady,
    /// The kubelet Lease unrenewed for `lease_stale`, as stamped and as the coordinator saw
    /// it, whatever Ready says. The release does not wait for Ready either: under the
    /// proof of power-off it is held only while the Lease is renewed, and the coordinator
    /// deletes the node's pods itself (the pod GC acts only on nodes that are not Ready).
    Lease,
}

impl SecondSignal {
    /// The configuration value.
    pub fn as_str(self) -> &'static str {
        match self {
            SecondSignal::LeaseAndReady => "lease-and-ready",
            SecondSignal::Lease => "lease",
        }
    }
}

/// The Lease's age at `now`: the younger of its age as stamped (`renew`, the kubelet's
/// clock) and its age as observed (`seen_since`, when the coordinator first saw that
/// `renewTime`, the coordinator's clock). `None` when it was never renewed and never seen:
/// no age, the Lease is as stale as can be.
pub fn lease_age(
    now: Timestamp,
    renew: Option<Timestamp>,
    seen_since: Option<Timestamp>,
) -> Option<Duration> {
    let age = |t: Timestamp| now.duration_since(t).unsigned_abs();
    let clamp_future = |t: Timestamp| if t > now { Duration::ZERO } else { age(t) };
    match (renew.map(clamp_future), seen_since.map(clamp_future)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// True when a Lease of age `age` ([`lease_age`]) counts as stale.
pub fn is_stale(age: Option<Duration>, lease_stale: Duration) -> bool {
    age.is_none_or(|a| a >= lease_stale)
}

/// When the coordinator first saw the `renewTime` value `current`: `earlier` (a value it saw
/// before and when it first saw it) if it is the same value, else `now`. A Lease that
/// vanished (`current` is `None`: deleted with its Node by the garbage collector) was not
/// renewed, so it keeps the earlier sighting.
pub fn seen_since(
    current: Option<Timestamp>,
    earlier: Option<(Option<Timestamp>, Timestamp)>,
    now: Timestamp,
) -> Timestamp {
    match earlier {
        Some((value, since)) if value == current || current.is_none() => since.min(now),
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn with_agreeing_clocks_the_stamp_decides_once_the_value_was_seen_at_once() {
        // Renewed at 0, seen at 1: at 25 the stamp says 25 s, the observation 24 s.
        assert_eq!(
            lease_age(t(25), Some(t(0)), Some(t(1))),
            Some(Duration::from_secs(24))
        );
    }

    #[test]
    fn a_kubelet_clock_far_behind_does_not_make_a_renewing_lease_stale() {
        // The kubelet stamps 60 s in the past, but the value was first seen 3 s ago.
        let age = lease_age(t(100), Some(t(37)), Some(t(97)));
        assert_eq!(age, Some(Duration::from_secs(3)));
        assert!(!is_stale(age, Duration::from_secs(20)));
    }

    #[test]
    fn a_kubelet_clock_ahead_counts_as_just_renewed_until_seen_old() {
        assert_eq!(
            lease_age(t(10), Some(t(40)), Some(t(0))),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn without_an_observation_the_stamp_alone_counts_and_without_either_it_is_stale() {
        assert_eq!(
            lease_age(t(30), Some(t(0)), None),
            Some(Duration::from_secs(30))
        );
        assert_eq!(lease_age(t(30), None, None), None);
        assert!(is_stale(None, Duration::from_secs(20)));
    }

    #[test]
    fn a_value_seen_before_keeps_its_first_sighting_a_new_one_starts_now() {
        let earlier = Some((Some(t(0)), t(2)));
        assert_eq!(seen_since(Some(t(0)), earlier, t(30)), t(2));
        assert_eq!(seen_since(Some(t(29)), earlier, t(30)), t(30));
        assert_eq!(seen_since(None, Some((None, t(5))), t(30)), t(5));
        assert_eq!(
            seen_since(None, earlier, t(30)),
            t(2),
            "a Lease deleted with its Node was not renewed"
        );
        assert_eq!(seen_since(Some(t(0)), None, t(30)), t(30));
    }

    #[test]
    fn the_configuration_values() {
        #[derive(Deserialize)]
        struct C {
            s: SecondSignal,
        }
        let c: C = toml::from_str("s = \"lease\"").unwrap();
        assert_eq!(c.s, SecondSignal::Lease);
        let c: C = toml::from_str("s = \"lease-and-ready\"").unwrap();
        assert_eq!(c.s.as_str(), "lease-and-ready");
        assert!(toml::from_str::<C>("s = \"ready\"").is_err());
    }
}
