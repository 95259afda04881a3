//! `[fence]` in the coordinator configuration: the fence flow's time limits and `keep_off`,
//! per BMC (by machine type or gateway), and the rules they must follow.
//!
//! This module parses and resolves only; [`crate::config`] places the section in the file,
//! and the flow ([`super::flow`]) runs with the [`FenceTimeouts`](super::flow::FenceTimeouts) it resolves to.

use std::time::Duration;

use serde::Deserialize;

use crate::duration::{self, opt as opt_duration};

/// `[fence]`: the fence flow's time limits and whether a fenced machine stays off.
///
/// The limits are per BMC, since BMCs differ: a `[fence.machine_types.<type>]` table
/// (a hardware model, so a BMC firmware) or a `[fence.gateways.<name>]` table (the
/// `[[gateways.targets]]` of that name: a rack of one vendor) overrides any of them. For
/// each key the machine type's value wins, then the gateway's, then the section's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FenceSection {
    /// From the power-off request until the BMC reads back off (default 60 s).
    #[serde(with = "duration")]
    pub off_timeout: Duration,
    /// From the power-on request until the gateway says on, its retries of a busy BMC
    /// included (default 120 s).
    #[serde(with = "duration")]
    pub on_timeout: Duration,
    /// From the release until the node's pods and VolumeAttachments are gone (default 10 min).
    #[serde(with = "duration")]
    pub release_timeout: Duration,
    /// From the power-on until the agent is back with a new boot id and the Node restored
    /// (default 15 min: server firmware boots slowly).
    #[serde(with = "duration")]
    pub back_timeout: Duration,
    /// Leave a fenced machine off: the flow ends after the release (the Node keeps its
    /// out-of-service taint), and a flow failing after the release does not power it on.
    /// For machines a person must look at before they run again. Default false.
    pub keep_off: bool,
    /// Overrides by machine type.
    pub machine_types: std::collections::BTreeMap<String, FenceOverride>,
    /// Overrides by gateway name (`[[gateways.targets]]` `name`).
    pub gateways: std::collections::BTreeMap<String, FenceOverride>,
}

/// One `[fence.machine_types.<type>]` or `[fence.gateways.<name>]` table: any key left out
/// comes from the next level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceOverride {
    /// `off_timeout` for these machines.
    #[serde(default, with = "opt_duration")]
    pub off_timeout: Option<Duration>,
    /// `on_timeout` for these machines.
    #[serde(default, with = "opt_duration")]
    pub on_timeout: Option<Duration>,
    /// `release_timeout` for these machines.
    #[serde(default, with = "opt_duration")]
    pub release_timeout: Option<Duration>,
    /// `back_timeout` for these machines.
    #[serde(default, with = "opt_duration")]
    pub back_timeout: Option<Duration>,
    /// `keep_off` for these machines.
    #[serde(default)]
    pub keep_off: Option<bool>,
}

impl Default for FenceSection {
    fn default() -> Self {
        let t = crate::fence::flow::FenceTimeouts::default();
        Self {
            off_timeout: t.off,
            on_timeout: t.on,
            release_timeout: t.release,
            back_timeout: t.back,
            keep_off: false,
            machine_types: Default::default(),
            gateways: Default::default(),
        }
    }
}

impl FenceSection {
    /// The overrides that apply to a machine of `machine_type` behind `gateway`, most
    /// specific first.
    fn overrides(
        &self,
        machine_type: Option<&str>,
        gateway: Option<&str>,
    ) -> [Option<&FenceOverride>; 2] {
        [
            machine_type.and_then(|t| self.machine_types.get(t)),
            gateway.and_then(|g| self.gateways.get(g)),
        ]
    }

    /// The time limits of a machine of `machine_type` whose BMC is behind `gateway`.
    pub fn timeouts_for(
        &self,
        machine_type: Option<&str>,
        gateway: Option<&str>,
    ) -> crate::fence::flow::FenceTimeouts {
        let o = self.overrides(machine_type, gateway);
        let pick = |f: fn(&FenceOverride) -> Option<Duration>, base: Duration| {
            o.iter().flatten().find_map(|x| f(x)).unwrap_or(base)
        };
        crate::fence::flow::FenceTimeouts {
            off: pick(|x| x.off_timeout, self.off_timeout),
            on: pick(|x| x.on_timeout, self.on_timeout),
            release: pick(|x| x.release_timeout, self.release_timeout),
            back: pick(|x| x.back_timeout, self.back_timeout),
        }
    }

    /// Whether a fenced machine of `machine_type` behind `gateway` stays off.
    pub fn keep_off_for(&self, machine_type: Option<&str>, gateway: Option<&str>) -> bool {
        self.overrides(machine_type, gateway)
            .iter()
            .flatten()
            .find_map(|x| x.keep_off)
            .unwrap_or(self.keep_off)
    }

    /// Every limit above zero; every gateway override names a configured gateway.
    pub(crate) fn validate(
        &self,
        gateways: &[crate::gateway::GatewayTarget],
    ) -> Result<(), String> {
        let zero = |key: &str, d: Option<Duration>| match d {
            Some(d) if d.is_zero() => Err(format!(
                "key `{key}`: must be greater than 0 (a zero limit fails every fence at once)"
            )),
            _ => Ok(()),
        };
        zero("fence.off_timeout", Some(self.off_timeout))?;
        zero("fence.on_timeout", Some(self.on_timeout))?;
        zero("fence.release_timeout", Some(self.release_timeout))?;
        zero("fence.back_timeout", Some(self.back_timeout))?;
        for (table, map) in [
            ("machine_types", &self.machine_types),
            ("gateways", &self.gateways),
        ] {
            for (name, o) in map {
                let key = |k: &str| format!("fence.{table}.{name}.{k}");
                zero(&key("off_timeout"), o.off_timeout)?;
                zero(&key("on_timeout"), o.on_timeout)?;
                zero(&key("release_timeout"), o.release_timeout)?;
                zero(&key("back_timeout"), o.back_timeout)?;
            }
        }
        if let Some(name) = self
            .gateways
            .keys()
            .find(|n| !gateways.iter().any(|g| &g.name == *n))
        {
            let known: Vec<&str> = gateways.iter().map(|g| g.name.as_str()).collect();
            return Err(format!(
                "key `fence.gateways.{name}`: no [[gateways.targets]] is named {name:?} \
                 (configured: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        }
        Ok(())
    }
}
