//! Operator switches: what `coordinatorctl` changed over the config file's `[remediation]`
//! (pause with its reason, observe mode, auto-repair on/off and its variables, CKE's
//! constraints, a confirmed outage, cleared machines). Stored in `remediation_switches` and
//! `remediation_cleared` (see [`super::journal`]); an unset switch leaves the file's value.
//!
//! Pure data and the merge onto a config; the admin handler writes the store first and
//! changes these only after it committed.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::{MachineFilter, RemediationConfig};
use super::input::Control;
use crate::clock::from_unix_ms;

/// Switch keys as stored.
pub mod key {
    /// The pause reason (present: paused).
    pub const PAUSED: &str = "paused";
    /// `on` / `off`.
    pub const OBSERVE: &str = "observe";
    /// `on` / `off`.
    pub const AUTO_REPAIR: &str = "auto_repair";
    /// sabakan variables JSON.
    pub const VARIABLES: &str = "auto_repair_variables";
    /// A count.
    pub const MAX_ENTRIES: &str = "maximum-repair-queue-entries";
    /// Seconds.
    pub const WAIT_REBOOTING: &str = "wait-seconds-to-repair-rebooting";
    /// Present: the time of the last confirmation is its `set_ms`.
    pub const OUTAGE_CONFIRMED: &str = "outage_confirmed";
}

/// The switches in force.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Switches {
    /// Reason and since when.
    pub paused: Option<(String, Timestamp)>,
    /// Observe mode, over the file's `observe`.
    pub observe: Option<bool>,
    /// Auto-repair on/off, over the file's `auto_repair.enabled`.
    pub auto_repair: Option<bool>,
    /// `having` / `notHaving` and the JSON they came from.
    pub variables: Option<(Variables, String)>,
    /// CKE's `maximum-repair-queue-entries`.
    pub max_entries: Option<u32>,
    /// CKE's `wait-seconds-to-repair-rebooting`.
    pub wait_rebooting: Option<u64>,
    /// When an operator last confirmed an outage.
    pub outage_confirmed_at: Option<Timestamp>,
    /// When each machine was last cleared of `needs-human`.
    pub cleared: BTreeMap<String, Timestamp>,
}

/// sabakan's auto-repair query variables.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variables {
    /// A machine must match every field given.
    #[serde(default)]
    pub having: MachineFilter,
    /// A machine matching any field given is left alone.
    #[serde(default, rename = "notHaving", alias = "not_having")]
    pub not_having: MachineFilter,
}

impl Variables {
    /// Parses `{"having": {...}, "notHaving": {...}}`: an object (serde would also take a
    /// list, `[]`, as a struct of defaults) whose `having` names at least one state.
    pub fn parse(json: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| format!("auto-repair variables: {e}"))?;
        if !value.is_object() {
            return Err(format!(
                "auto-repair variables: expected an object like {{\"having\": {{\"states\": [\"unhealthy\", \"unreachable\"]}}, \"notHaving\": {{\"roles\": [\"boot\"]}}}}, got {}",
                match &value {
                    Value::Array(_) => "a list",
                    Value::String(_) => "a string",
                    Value::Number(_) => "a number",
                    Value::Bool(_) => "true or false",
                    _ => "null",
                }
            ));
        }
        let vars: Self =
            serde_json::from_value(value).map_err(|e| format!("auto-repair variables: {e}"))?;
        if vars.having.states.is_empty() {
            return Err(format!(
                "auto-repair variables: {}",
                super::config::NO_HAVING_STATES
            ));
        }
        if let Some(m) = super::config::states_excluded(&vars.having, &vars.not_having) {
            return Err(format!("auto-repair variables: {m}"));
        }
        Ok(vars)
    }
}

/// A filter as sabakan-style JSON.
pub fn filter_json(f: &MachineFilter) -> Value {
    json!({
        "states": f.states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "roles": f.roles,
        "racks": f.racks,
        "labels": f.labels,
    })
}

fn on(v: &str) -> Option<bool> {
    match v {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

impl Switches {
    /// From the stored rows (key → value, set at ms) and cleared machines. A row that no
    /// longer parses is skipped with a warning: the file's value holds.
    pub fn from_rows(
        rows: &BTreeMap<String, (String, i64)>,
        cleared: BTreeMap<String, Timestamp>,
    ) -> Self {
        let mut s = Switches {
            cleared,
            ..Switches::default()
        };
        for (k, (v, at)) in rows {
            let at = from_unix_ms(*at);
            let ok = match k.as_str() {
                key::PAUSED => {
                    s.paused = Some((v.clone(), at));
                    true
                }
                key::OBSERVE => {
                    s.observe = on(v);
                    s.observe.is_some()
                }
                key::AUTO_REPAIR => {
                    s.auto_repair = on(v);
                    s.auto_repair.is_some()
                }
                key::VARIABLES => match Variables::parse(v) {
                    Ok(vars) => {
                        s.variables = Some((vars, v.clone()));
                        true
                    }
                    Err(_) => false,
                },
                key::MAX_ENTRIES => {
                    s.max_entries = v.parse().ok();
                    s.max_entries.is_some()
                }
                key::WAIT_REBOOTING => {
                    s.wait_rebooting = v.parse().ok();
                    s.wait_rebooting.is_some()
                }
                key::OUTAGE_CONFIRMED => {
                    s.outage_confirmed_at = Some(at);
                    true
                }
                _ => false,
            };
            if !ok {
                tracing::warn!(key = %k, value = %v, "ignoring a stored remediation switch that does not parse");
            }
        }
        s
    }

    /// `base` with the switches applied.
    pub fn effective(&self, base: &RemediationConfig) -> RemediationConfig {
        let mut c = base.clone();
        if let Some(o) = self.observe {
            c.observe = o;
        }
        if let Some(a) = self.auto_repair {
            c.auto_repair.enabled = a;
        }
        if let Some((v, _)) = &self.variables {
            c.auto_repair.having = v.having.clone();
            c.auto_repair.not_having = v.not_having.clone();
        }
        if let Some(m) = self.max_entries {
            c.maximum_repair_queue_entries = m;
        }
        if let Some(w) = self.wait_rebooting {
            c.wait_seconds_to_repair_rebooting = w;
        }
        c
    }

    /// The core's view of the switches.
    pub fn control(&self) -> Control {
        Control {
            paused: self.paused.clone(),
            outage_confirmed_at: self.outage_confirmed_at,
            cleared: self.cleared.clone(),
        }
    }

    /// The variables in force as JSON text.
    pub fn variables_json(&self, base: &RemediationConfig) -> String {
        match &self.variables {
            Some((_, text)) => text.clone(),
            None => json!({
                "having": filter_json(&base.auto_repair.having),
                "notHaving": filter_json(&base.auto_repair.not_having),
            })
            .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::MachineState;

    fn rows(kv: &[(&str, &str)]) -> BTreeMap<String, (String, i64)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), (v.to_string(), 1_800_000_000_000)))
            .collect()
    }

    #[test]
    fn stored_switches_override_the_file_and_unset_ones_leave_it() {
        let base = RemediationConfig::default();
        let s = Switches::from_rows(&BTreeMap::new(), BTreeMap::new());
        assert_eq!(s.effective(&base), base);
        let s = Switches::from_rows(
            &rows(&[
                (key::OBSERVE, "on"),
                (key::AUTO_REPAIR, "off"),
                (key::MAX_ENTRIES, "3"),
                (key::WAIT_REBOOTING, "60"),
                (key::PAUSED, "switch upgrade"),
                (
                    key::VARIABLES,
                    r#"{"having": {"states": ["unreachable"], "racks": ["r1"]}, "notHaving": {"roles": ["ss"]}}"#,
                ),
            ]),
            BTreeMap::new(),
        );
        let c = s.effective(&base);
        assert!(c.observe && !c.auto_repair.enabled);
        assert_eq!(c.maximum_repair_queue_entries, 3);
        assert_eq!(c.wait_seconds_to_repair_rebooting, 60);
        assert_eq!(c.auto_repair.having.states, [MachineState::Unreachable]);
        assert_eq!(c.auto_repair.having.racks, ["r1"]);
        assert_eq!(c.auto_repair.not_having.roles, ["ss"]);
        assert_eq!(s.control().paused.unwrap().0, "switch upgrade");
    }

    #[test]
    fn a_stored_value_that_no_longer_parses_leaves_the_file_value() {
        let base = RemediationConfig::default();
        let s = Switches::from_rows(
            &rows(&[(key::OBSERVE, "maybe"), (key::VARIABLES, "{\"havin\": {}}")]),
            BTreeMap::new(),
        );
        assert_eq!(s.effective(&base), base);
    }

    #[test]
    fn default_variables_are_the_files_filters_as_sabakan_json() {
        let base = RemediationConfig::default();
        let s = Switches::default();
        let v: Value = serde_json::from_str(&s.variables_json(&base)).unwrap();
        assert_eq!(v["having"]["states"], json!(["unhealthy", "unreachable"]));
        assert_eq!(v["notHaving"]["roles"], json!(["boot"]));
        // What get-variables prints, set-variables takes back.
        let parsed = Variables::parse(&v.to_string()).unwrap();
        assert_eq!(parsed.having, base.auto_repair.having);
    }

    #[test]
    fn variables_whose_not_having_excludes_every_state_are_refused() {
        let e = Variables::parse(
            r#"{"having": {"states": ["unhealthy"]}, "notHaving": {"states": ["unhealthy"]}}"#,
        )
        .unwrap_err();
        assert!(e.contains("no machine can ever be a candidate"), "{e}");
    }
}
