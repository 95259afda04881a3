//! The three stories the demo tells: each injects a failure, waits for what the coordinator
//! does by itself, checks it ended as described, and says what happened in one sentence.

use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::Value;
use testkit::ctl_json::RemediationStatus;

use super::assets::DEAD_MACHINE_BUILTINS;
use super::{DEAD_HOST, DEAD_POD, Demo, HELD_PASSES, SCENARIO_TIMEOUT, field};

impl Demo {
    /// 1. A hung kubelet, restarted by the agent on the coordinator's request.
    pub(super) fn kubelet_failure(&mut self) -> anyhow::Result<String> {
        let host = "demo-r1-n2";
        let (addr, state) = {
            let m = self.machine(host);
            (m.addr, m.kubelet_state.clone())
        };
        std::fs::write(&state, "hung\n")?;
        self.say(
            "inject",
            &format!("{host}: the kubelet hangs (its healthz answers 500)"),
        );
        let t0 = Instant::now();
        let admitted = self.wait_decision(addr, "admitted", "auto-repair", 1)?;
        if admitted.operation.as_deref() != Some("unhealthy") {
            bail!("admitted with operation {:?}", admitted.operation);
        }
        let entry = self.wait_finished(addr)?;
        let index = field(&entry, "index").to_string();
        if field(&entry, "operation") != "unhealthy" || field(&entry, "status") != "succeeded" {
            bail!(
                "entry {index} ({}) ended {}; see `coordinatorctl repair-queue show {index}`",
                field(&entry, "operation"),
                field(&entry, "status")
            );
        }
        let show: Value = self
            .coord()
            .ctl_json(&["repair-queue", "show", &index, "--json"])?;
        let restarted = show["history"].as_array().is_some_and(|h| {
            h.iter().any(|e| {
                field(e, "event") == "command-succeeded"
                    && field(e, "detail").contains("restart-unit kubelet")
            })
        });
        if !restarted {
            bail!("entry {index} succeeded without a restart-unit kubelet step: {show}");
        }
        let restarts = std::fs::read_to_string(self.dir.join("restarts.log")).unwrap_or_default();
        if !restarts.contains(&format!("{host} kubelet")) {
            bail!("the agent's restart command never ran (restarts.log: {restarts:?})");
        }
        self.wait_state(addr, "healthy")?;
        Ok(format!(
            "enqueued `unhealthy` by itself (entry {index}); the agent ran its kubelet restart command; healthy again, entry succeeded ({:.0} s)",
            t0.elapsed().as_secs_f64()
        ))
    }

    /// 2. A dead machine, powered off and on through the bmc-gateway by the repair
    ///    procedure (or power-cycled by the stand-in without `ipmi_sim`).
    pub(super) fn dead_machine(&mut self) -> anyhow::Result<String> {
        let host = DEAD_HOST;
        let addr = self.machine(host).addr;
        let boot_before = self.boot_id(addr)?;
        if let Some(mut a) = self.machine(host).agent.take() {
            a.sigkill();
        }
        self.k8s.set_kubelet_alive(host, false);
        self.say(
            "inject",
            &format!("{host} dies: its agent is killed (SIGKILL) and its kubelet stops renewing its Lease"),
        );
        let t0 = Instant::now();
        let admitted = self.wait_decision(addr, "admitted", "auto-repair", 1)?;
        if admitted.operation.as_deref() != Some("unreachable") {
            bail!("admitted with operation {:?}", admitted.operation);
        }
        if !admitted.sentence.contains("Lease") {
            bail!(
                "admitted without the kubelet Lease as second signal: {}",
                admitted.sentence
            );
        }
        if self.ha.is_some() {
            // --ha: the leader dies once its fence has powered the machine off.
            if self.bmcs.is_some() {
                self.wait(
                    &format!("the fence to power {host} off"),
                    SCENARIO_TIMEOUT,
                    |d| {
                        d.machines
                            .iter()
                            .find(|m| m.host == host)
                            .is_some_and(|m| !m.powered)
                            .then_some(())
                    },
                )?;
            }
            self.failover()?;
        }
        let entry = self.wait_finished(addr)?;
        let index = field(&entry, "index").to_string();
        if field(&entry, "operation") != "unreachable" || field(&entry, "status") != "succeeded" {
            bail!(
                "entry {index} ({}) ended {}; see `coordinatorctl repair-queue show {index}`",
                field(&entry, "operation"),
                field(&entry, "status")
            );
        }
        self.wait_state(addr, "healthy")?;
        let boot_after = self.boot_id(addr)?;
        if boot_after == boot_before {
            bail!("{host} is back with the same boot id {boot_after}");
        }
        let power = self.power_path(addr, &index)?;
        let (released, workload) = self.workload_on(host);
        // A fence releases the workload before it powers the machine on.
        if self.bmcs.is_some() && fences() && !released {
            bail!("{workload}");
        }
        Ok(format!(
            "dead by two signals (agent silent, Lease stale, Ready Unknown); enqueued `unreachable` (entry {index}); {power}; back with a new boot id, entry succeeded ({:.0} s); {workload}",
            t0.elapsed().as_secs_f64()
        ))
    }

    /// How the dead machine's power came back, checked: through the gateway, the entry's
    /// history names each built-in and the machine's BMC applied a power off, then an on.
    fn power_path(&mut self, addr: &str, index: &str) -> anyhow::Result<String> {
        let Some(bmcs) = &self.bmcs else {
            return Ok("power-cycle stand-in ran (no BMC, no bmc-gateway)".into());
        };
        let changes: Vec<_> = bmcs.seen.iter().filter(|e| e.machine == addr).collect();
        let off = changes.iter().position(|e| !e.on);
        let on = changes.iter().rposition(|e| e.on);
        let (Some(off), Some(on)) = (off, on) else {
            bail!("{addr}'s BMC never applied a power off and a power on: {changes:?}");
        };
        if on < off {
            bail!("{addr}'s BMC applied the power on before the power off: {changes:?}");
        }
        let show: Value = self
            .coord()
            .ctl_json(&["repair-queue", "show", index, "--json"])?;
        for (step, (builtin, _)) in DEAD_MACHINE_BUILTINS.iter().enumerate() {
            let ran = show["history"].as_array().is_some_and(|h| {
                h.iter().any(|e| {
                    field(e, "event") == "command-succeeded"
                        && field(e, "detail").starts_with(&format!("step {step}: "))
                })
            });
            if !ran {
                bail!("entry {index} has no successful step {step} ({builtin}): {show}");
            }
        }
        let steps: Vec<&str> = DEAD_MACHINE_BUILTINS.iter().map(|(b, _)| *b).collect();
        Ok(format!(
            "{} through the bmc-gateway: its ipmi_sim BMC powered it off at {} and on at {}",
            steps.join(" then "),
            changes[off].at,
            changes[on].at
        ))
    }

    /// Whether the dead machine's StatefulSet pod and its volume attachment are released
    /// (gone from the API server), and a sentence saying where they stand.
    fn workload_on(&self, host: &str) -> (bool, String) {
        let (ns, pod, _) = DEAD_POD;
        let bound = self
            .k8s
            .pods_on(host)
            .iter()
            .any(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == pod);
        let attached = !self.k8s.volume_attachments_on(host).is_empty();
        if !bound && !attached {
            return (
                true,
                format!(
                    "workload released: {ns}/{pod} and its volume attachment are gone from {host}"
                ),
            );
        }
        let why = if fences() {
            ""
        } else {
            " (power off/on alone does not release it; the repair queue's @fence will)"
        };
        let what = match (bound, attached) {
            (true, true) => format!("{ns}/{pod} and its volume attachment"),
            (true, false) => format!("{ns}/{pod}"),
            _ => "the volume attachment".to_string(),
        };
        (
            false,
            format!("workload not released: {what} still on {host}{why}"),
        )
    }
}

/// Whether the dead machine's procedure fences (`@fence`), which releases its workload.
fn fences() -> bool {
    DEAD_MACHINE_BUILTINS.iter().any(|(b, _)| *b == "@fence")
}

impl Demo {
    /// 3. A rack losing power: held as one event, nothing enqueued.
    pub(super) fn rack_power_loss(&mut self) -> anyhow::Result<String> {
        // --ha: after a takeover a machine not heard from since gets the start's grace
        // (agents reconnecting); the rack goes down once every agent reports to the leader.
        self.wait_fleet_back()?;
        let rack = "rack-2";
        let entries_before = self.snap.entries.len();
        let hosts: Vec<(&'static str, &'static str)> = self
            .machines
            .iter()
            .filter(|m| m.rack == rack)
            .map(|m| (m.addr, m.host))
            .collect();
        for i in 0..self.machines.len() {
            if self.machines[i].rack == rack {
                self.power_off(i);
                // The BMCs, on the rack's power too, read off when it comes back.
                if let Some(b) = &self.bmcs {
                    b.set_power_state(self.machines[i].addr, false)?;
                }
            }
        }
        self.say(
            "inject",
            &format!("{rack} loses power: its 4 agents die and their kubelet Leases stop at once"),
        );
        let mut sentence = String::new();
        for (addr, _) in &hosts {
            sentence = self
                .wait_decision(addr, "held", "correlated-failure", 1)?
                .sentence;
        }
        // Passes go on holding; nothing is enqueued meanwhile.
        self.wait_decision(hosts[0].0, "held", "correlated-failure", HELD_PASSES)?;
        let st: RemediationStatus = self
            .coord()
            .ctl_json(&["remediation", "status", "--json"])?;
        let limit = st
            .limits
            .iter()
            .find(|l| l.rule == "correlated-failure")
            .context("no correlated-failure limit in remediation status")?;
        if !limit.holding || !limit.sentence.contains(rack) {
            bail!("remediation status does not name {rack}: {limit:?}");
        }
        self.say(
            "status",
            &format!("coordinatorctl remediation status: {}", limit.sentence),
        );
        let enqueued: Vec<&Value> = self
            .snap
            .entries
            .iter()
            .filter(|e| hosts.iter().any(|(a, _)| field(e, "address") == *a))
            .collect();
        if !enqueued.is_empty() || self.snap.entries.len() != entries_before {
            bail!("entries were enqueued during the rack event: {enqueued:?}");
        }
        // The power returns: the machines boot, and nothing held is replayed.
        self.say(
            "inject",
            &format!("{rack}'s power returns: its machines boot (new boot ids)"),
        );
        for i in 0..self.machines.len() {
            if self.machines[i].rack == rack {
                if let Some(b) = &self.bmcs {
                    b.set_power_state(self.machines[i].addr, true)?;
                }
                self.power_on(i)?;
            }
        }
        for (addr, _) in &hosts {
            self.wait_state(addr, "healthy")?;
        }
        let back = u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
        self.wait(
            "three remediation passes after the return",
            SCENARIO_TIMEOUT,
            |d| {
                let st: RemediationStatus = d
                    .coord()
                    .ctl_json(&["remediation", "status", "--json"])
                    .ok()?;
                (testkit::ctl_json::ms(st.last_pass_at?) >= back + 1500).then_some(())
            },
        )?;
        if self.snap.entries.len() != entries_before {
            bail!(
                "entries were enqueued after {rack} came back: {:?}",
                self.snap.entries
            );
        }
        let sentence = sentence.strip_prefix("held: ").unwrap_or(&sentence);
        Ok(format!(
            "held as one rack event [correlated-failure]: {sentence}; nothing enqueued over {HELD_PASSES} passes; remediation status names {rack}; power back: all healthy, nothing replayed"
        ))
    }
}
