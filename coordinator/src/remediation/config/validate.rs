//! The checks of `[remediation]` that serde cannot make (each error names its key), and
//! parsing a section from TOML text with them.
//!
//! Kept apart from the section's types in [`super`] because the auto-repair source's checks
//! live with sabakan ([`crate::remediation::sabakan::validate`]), which reads those types: the
//! types import nothing that imports them.

use super::{
    AGENT_CHECK_KINDS, NO_HAVING_STATES, RemediationConfig, RemediationConfigError, Threshold,
    check_wait_rebooting, states_excluded,
};

impl RemediationConfig {
    /// Parses a `[remediation]` table's body from TOML text, then validates it.
    pub fn from_toml(text: &str) -> Result<Self, RemediationConfigError> {
        let cfg: Self = toml::from_str(text)
            .map_err(|e| RemediationConfigError::Parse(e.to_string().trim_end().to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks values serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), RemediationConfigError> {
        if self.auto_repair.having.states.is_empty() {
            return Err(RemediationConfigError::Invalid {
                key: "auto_repair.having.states".into(),
                message: NO_HAVING_STATES.into(),
            });
        }
        let err = |key: String, message: &str| {
            Err(RemediationConfigError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if let Some(m) = states_excluded(&self.auto_repair.having, &self.auto_repair.not_having) {
            return err("auto_repair.not_having.states".into(), &m);
        }
        if self.limits.correlated_failure.machines == 1 {
            return err(
                "limits.correlated_failure.machines".into(),
                "must be at least 2: with 1 every failed machine is an infrastructure event, \
                 so nothing is ever repaired",
            );
        }
        if self.lease_stale.is_zero() {
            return err("lease_stale".into(), "must be greater than 0");
        }
        if self.interval.is_zero() {
            return err("interval".into(), "must be greater than 0");
        }
        super::super::sabakan::validate(&self.auto_repair)?;
        for (i, o) in self.auto_repair.operation_by_check.iter().enumerate() {
            let kind = o.check.split(':').next().unwrap_or("");
            if !AGENT_CHECK_KINDS.contains(&kind) {
                return err(
                    format!("auto_repair.operation_by_check[{i}].check"),
                    &format!(
                        "{:?} is not an agent check; name one of {} (or KIND:SUBJECT)",
                        o.check,
                        AGENT_CHECK_KINDS.join(", ")
                    ),
                );
            }
            if o.operation.trim().is_empty() {
                return err(
                    format!("auto_repair.operation_by_check[{i}].operation"),
                    "must name a repair operation",
                );
            }
        }
        if self.journal_max_rows == 0 {
            return err("journal_max_rows".into(), "must be at least 1");
        }
        if self.maximum_repair_queue_entries == 0 {
            return err(
                "maximum_repair_queue_entries".into(),
                "must be at least 1: 0 would never enqueue anything",
            );
        }
        if let Err(e) = check_wait_rebooting(self.wait_seconds_to_repair_rebooting) {
            return err("wait_seconds_to_repair_rebooting".into(), &e);
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.fleet_cap.count", l.fleet_cap.count),
            ("limits.slow_start.width", l.slow_start.width),
            (
                "limits.correlated_failure.machines",
                l.correlated_failure.machines,
            ),
            (
                "limits.self_isolation.min_silent",
                l.self_isolation.min_silent,
            ),
            ("limits.rate.per_hour", l.rate.per_hour),
            (
                "limits.rate.per_domain_per_hour",
                l.rate.per_domain_per_hour,
            ),
            (
                "limits.escalation.max_remediations",
                l.escalation.max_remediations,
            ),
        ] {
            if v == 0 {
                return err(
                    key.into(),
                    "must be at least 1, or nothing is ever repaired",
                );
            }
        }
        for (key, p) in [
            ("limits.fleet_cap.percent", l.fleet_cap.percent),
            ("limits.self_isolation.percent", l.self_isolation.percent),
        ] {
            if p == 0 || p > 100 {
                return err(key.into(), "must be a percentage from 1 to 100");
            }
        }
        if l.slow_start.max_width < l.slow_start.width {
            return err(
                "limits.slow_start.max_width".into(),
                "must be at least limits.slow_start.width",
            );
        }
        for (key, d) in [
            (
                "limits.correlated_failure.window",
                l.correlated_failure.window,
            ),
            ("limits.self_isolation.window", l.self_isolation.window),
            ("limits.escalation.window", l.escalation.window),
        ] {
            if d.is_zero() {
                return err(key.into(), "must be greater than 0");
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, hc) in self.health_checks.iter().enumerate() {
            let at = |k: &str| format!("health_checks[{i}].{k}");
            if hc.name.is_empty() || !names.insert(hc.name.as_str()) {
                return err(at("name"), "must be non-empty and unique");
            }
            if hc.operation.is_empty() {
                return err(at("operation"), "must not be empty");
            }
            if hc.unhealthy_conditions.is_empty() {
                return err(at("unhealthy_conditions"), "needs at least one condition");
            }
            for (j, c) in hc.unhealthy_conditions.iter().enumerate() {
                if !["True", "False", "Unknown"].contains(&c.status.as_str()) {
                    return err(
                        at(&format!("unhealthy_conditions[{j}].status")),
                        "must be True, False or Unknown",
                    );
                }
                if c.is_agent_check() && c.status != "False" {
                    return err(
                        at(&format!("unhealthy_conditions[{j}].status")),
                        "an agent check is unhealthy only as status False (failing)",
                    );
                }
            }
            match (hc.max_unhealthy, hc.unhealthy_range) {
                (Some(_), Some(_)) => {
                    return err(
                        at("unhealthy_range"),
                        "give either max_unhealthy or unhealthy_range, not both",
                    );
                }
                (Some(Threshold::Percent(p)), None) if p > 100 => {
                    return err(at("max_unhealthy"), "a percentage must be at most 100%");
                }
                _ => {}
            }
        }
        Ok(())
    }
}
