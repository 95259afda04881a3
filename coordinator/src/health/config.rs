//! `[health]` in the coordinator configuration: how often agents report and how long a
//! silence lasts before a machine is unreachable.
//!
//! This module parses only; [`HealthSection::resolved`] gives the effective
//! [`HealthConfig`](super::HealthConfig) the pure derivation ([`super::derive`]) runs with.

use std::time::Duration;

use serde::Deserialize;

use super::{DEFAULT_GOODBYE_GRACE, DEFAULT_GRACE_INTERVALS, DEFAULT_REPORT_INTERVAL};
use crate::duration::{self, opt as opt_duration};

/// `[health]`: how reports become states.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    /// How often agents report (should match their `report_interval`).
    #[serde(default = "default_report_interval", with = "duration")]
    pub report_interval: Duration,
    /// Silence after which a machine is unreachable; default 3 report intervals.
    #[serde(default, with = "opt_duration")]
    pub unreachable_grace: Option<Duration>,
    /// Silence after a goodbye after which a machine is unreachable after all.
    #[serde(default = "default_goodbye_grace", with = "duration")]
    pub goodbye_grace: Duration,
}

impl Default for HealthSection {
    fn default() -> Self {
        Self {
            report_interval: DEFAULT_REPORT_INTERVAL,
            unreachable_grace: None,
            goodbye_grace: DEFAULT_GOODBYE_GRACE,
        }
    }
}

impl HealthSection {
    /// The effective health settings.
    pub fn resolved(&self) -> crate::health::HealthConfig {
        crate::health::HealthConfig {
            report_interval: self.report_interval,
            unreachable_grace: self
                .unreachable_grace
                .unwrap_or(self.report_interval * DEFAULT_GRACE_INTERVALS),
            goodbye_grace: self.goodbye_grace,
        }
    }
}

fn default_report_interval() -> Duration {
    DEFAULT_REPORT_INTERVAL
}
fn default_goodbye_grace() -> Duration {
    DEFAULT_GOODBYE_GRACE
}
