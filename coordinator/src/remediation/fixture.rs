//! The chainable fixture builder the remediation tests share, in the house's `case()`
//! shape: a fleet, a node view, a queue, a history and a clock, each changed by one call.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use protocol::admin::repair::RepairStatus;
use protocol::messages::GoodbyeReason;

use super::input::{
    Condition, FailingCheck, KubeFacts, Machine, NodeFacts, QueueEntry, RepairOutcome,
};
use super::{Decision, Input, Outcome, Pass, RemediationConfig, Rule, decide};
use crate::health::MachineState;

/// The fixed start of every case.
pub(super) fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn ago(now: Timestamp, s: i64) -> Timestamp {
    now - SignedDuration::from_secs(s)
}

/// The health grace the fixture assumes: an agent silent for `s` became unreachable
/// `s - GRACE` ago.
const GRACE: i64 = 15;

/// One test's world.
#[derive(Clone)]
pub(super) struct Case {
    pub(super) input: Input,
    pub(super) cfg: RemediationConfig,
    pub(super) now: Timestamp,
}

/// A fresh Kubernetes view, default config, no machines.
pub(super) fn case() -> Case {
    Case {
        input: Input {
            kube: Some(KubeFacts {
                refreshed_at: Some(t0()),
                max_age: Duration::from_secs(30),
            }),
            ..Input::default()
        },
        cfg: RemediationConfig::default(),
        now: t0(),
    }
}

/// A healthy, reporting machine whose Node is Ready and whose Lease is fresh.
pub(super) fn healthy(address: &str, rack: &str, now: Timestamp) -> Machine {
    Machine {
        address: address.to_string(),
        serial: format!("SN-{address}"),
        rack: rack.to_string(),
        role: "cs".into(),
        machine_type: Some("qemu".into()),
        labels: BTreeMap::new(),
        state: MachineState::Healthy,
        since: ago(now, 86_400),
        last_report_at: Some(now),
        failing_checks: Vec::new(),
        goodbye: None,
        // Without a crash kernel unless a case says so: `kdump_wait` only delays machines
        // that have one.
        kdump_loaded: false,
        dump: super::input::Dump::None,
        booted_at: Some(ago(now, 86_400)),
        last_silence: None,
        node: Some(NodeFacts {
            name: format!("node-{address}"),
            lease_renewed_at: Some(now),
            lease_seen_since: None,
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                since: ago(now, 86_400),
            }],
        }),
    }
}

impl Case {
    /// Adds a healthy machine in rack `r1`.
    pub(super) fn machine(self, address: &str) -> Self {
        self.machine_in(address, "r1")
    }

    /// Adds a healthy machine in `rack`.
    pub(super) fn machine_in(mut self, address: &str, rack: &str) -> Self {
        self.input.machines.push(healthy(address, rack, self.now));
        self
    }

    /// Adds `n` healthy machines `RACK.0` … in `rack`.
    pub(super) fn rack(mut self, rack: &str, n: usize) -> Self {
        for i in 0..n {
            let m = healthy(&format!("{rack}.{i}"), rack, self.now);
            self.input.machines.push(m);
        }
        self
    }

    /// Changes the machine at `address`.
    pub(super) fn on(mut self, address: &str, f: impl FnOnce(&mut Machine, Timestamp)) -> Self {
        let now = self.now;
        let m = self
            .input
            .machines
            .iter_mut()
            .find(|m| m.address == address)
            .unwrap_or_else(|| panic!("no machine {address}"));
        f(m, now);
        self
    }

    /// Changes the last machine added.
    pub(super) fn m(mut self, f: impl FnOnce(&mut Machine, Timestamp)) -> Self {
        let now = self.now;
        f(self.input.machines.last_mut().expect("a machine"), now);
        self
    }

    /// The last machine's last report said its crash kernel is loaded.
    pub(super) fn crash_kernel(self) -> Self {
        self.m(|m, _| m.kdump_loaded = true)
    }

    /// The last machine's kdump initramfs said "dumping" `s` seconds ago.
    pub(super) fn dumping(self, s: i64) -> Self {
        self.m(move |m, now| m.dump = super::input::Dump::Dumping { since: ago(now, s) })
    }

    /// The last machine's kdump initramfs said "dump done" `s` seconds ago.
    pub(super) fn dump_done(self, s: i64) -> Self {
        self.m(move |m, now| m.dump = super::input::Dump::Done { at: ago(now, s) })
    }

    /// The last machine's agent reports `check` failing for `s` seconds.
    pub(super) fn failing(self, check: &str, s: i64) -> Self {
        let check = check.to_string();
        self.m(move |m, now| failing(m, now, &check, s))
    }

    /// The last machine's agent has been silent for `s` seconds (unreachable after the
    /// grace); its Node is untouched (Lease fresh, Ready True).
    pub(super) fn silent(self, s: i64) -> Self {
        self.m(|m, now| silent(m, now, s))
    }

    /// Agent silent, Lease unrenewed and Ready Unknown, all for `s` seconds.
    pub(super) fn dead(self, s: i64) -> Self {
        self.m(|m, now| dead(m, now, s))
    }

    /// The last machine's Lease was renewed `s` seconds ago.
    pub(super) fn lease(self, s: i64) -> Self {
        self.m(|m, now| m.node.as_mut().unwrap().lease_renewed_at = Some(ago(now, s)))
    }

    /// The view first saw the last machine's current Lease `s` seconds ago.
    pub(super) fn lease_seen(self, s: i64) -> Self {
        self.m(|m, now| m.node.as_mut().unwrap().lease_seen_since = Some(ago(now, s)))
    }

    /// The last machine's Node has condition `type_` = `status` since `s` seconds.
    pub(super) fn condition(self, type_: &str, status: &str, s: i64) -> Self {
        let (t, st) = (type_.to_string(), status.to_string());
        self.m(move |m, now| set_condition(m, now, &t, &st, s))
    }

    /// The last machine said goodbye (shutdown) `s` seconds ago and is `stopped`.
    pub(super) fn goodbye(self, s: i64) -> Self {
        self.m(|m, now| {
            m.state = MachineState::Stopped;
            m.since = ago(now, s);
            m.last_report_at = Some(ago(now, s + 1));
            m.goodbye = Some((GoodbyeReason::Shutdown, ago(now, s)));
        })
    }

    /// Adds a queue entry for `address`.
    pub(super) fn entry(mut self, address: &str, status: RepairStatus) -> Self {
        let index = self.input.queue.len() as u64 + 1;
        self.input.queue.push(QueueEntry {
            index,
            address: address.to_string(),
            operation: "unhealthy".into(),
            status,
            last_transition: self.now,
        });
        self
    }

    /// Adds a journal line: `address` was admitted `s` seconds ago.
    pub(super) fn admitted_before(mut self, address: &str, s: i64) -> Self {
        let domain = self
            .input
            .machines
            .iter()
            .find(|m| m.address == address)
            .map_or(String::new(), |m| m.rack.clone());
        self.input.history.push(Decision {
            at: ago(self.now, s),
            address: address.to_string(),
            domain,
            outcome: Outcome::Admitted,
            rule: Rule::AutoRepair,
            proposal: None,
            sentence: String::new(),
        });
        self
    }

    /// Adds a repair outcome: `address`'s repair ended `s` seconds ago.
    pub(super) fn outcome(mut self, address: &str, s: i64, succeeded: bool) -> Self {
        self.input.outcomes.push(RepairOutcome {
            address: address.to_string(),
            finished_at: ago(self.now, s),
            succeeded,
        });
        self
    }

    /// No `[kubernetes]` section.
    pub(super) fn no_kube(mut self) -> Self {
        self.input.kube = None;
        self
    }

    /// The Kubernetes view was last refreshed `s` seconds ago.
    pub(super) fn view_age(mut self, s: i64) -> Self {
        self.input.kube.as_mut().unwrap().refreshed_at = Some(ago(self.now, s));
        self
    }

    /// Lifts every limit but the one a test names afterwards, so only that one binds.
    pub(super) fn roomy(self) -> Self {
        self.cfg(|c| {
            c.limits.slow_start.width = 64;
            c.limits.slow_start.max_width = 64;
            c.limits.fleet_cap.count = 1000;
            c.limits.fleet_cap.percent = 100;
            c.limits.correlated_failure.machines = 1000;
            c.maximum_repair_queue_entries = 1000;
            c.limits.rate.per_hour = 1000;
            c.limits.rate.per_domain_per_hour = 1000;
        })
    }

    /// Changes the config.
    pub(super) fn cfg(mut self, f: impl FnOnce(&mut RemediationConfig)) -> Self {
        f(&mut self.cfg);
        self
    }

    /// Changes the input.
    pub(super) fn input(mut self, f: impl FnOnce(&mut Input, Timestamp)) -> Self {
        let now = self.now;
        f(&mut self.input, now);
        self
    }

    /// Moves the clock `s` seconds on; facts already given keep their times.
    pub(super) fn later(mut self, s: i64) -> Self {
        self.now = ago(self.now, -s);
        if let Some(k) = self.input.kube.as_mut() {
            k.refreshed_at = Some(self.now);
        }
        for m in &mut self.input.machines {
            if m.state == MachineState::Healthy || m.state == MachineState::Unhealthy {
                m.last_report_at = Some(self.now);
            }
            if let Some(n) = m.node.as_mut()
                && n.is_ready()
            {
                n.lease_renewed_at = Some(self.now);
            }
        }
        self
    }

    /// Runs one pass.
    pub(super) fn run(&self) -> Pass {
        self.cfg.validate().expect("a valid config");
        decide(&self.input, &self.cfg, self.now)
    }

    /// Runs one pass and returns the admitted addresses.
    pub(super) fn admitted(&self) -> Vec<String> {
        self.run().admitted.into_iter().map(|d| d.address).collect()
    }

    /// Runs one pass and returns the rule that held `address`, with its sentence.
    pub(super) fn held(&self, address: &str) -> (Rule, String) {
        let p = self.run();
        let d = p
            .held_for(address)
            .unwrap_or_else(|| panic!("{address} not held: {p:#?}"));
        (d.rule, d.sentence.clone())
    }

    /// Applies a pass as the loop would: admitted decisions go to the journal and into the
    /// queue as queued entries.
    pub(super) fn apply(mut self, pass: &Pass) -> Self {
        for d in &pass.admitted {
            self.input.history.push(d.clone());
            if d.outcome == Outcome::Admitted {
                self = self.entry(&d.address.clone(), RepairStatus::Queued);
            }
        }
        self
    }
}

/// `check` has been failing on `m` for `s` seconds.
pub(super) fn failing(m: &mut Machine, now: Timestamp, check: &str, s: i64) {
    m.state = MachineState::Unhealthy;
    m.since = ago(now, s);
    m.failing_checks.push(FailingCheck {
        name: check.to_string(),
        since: ago(now, s),
        kind_since: ago(now, s),
    });
}

/// `m`'s agent has been silent for `s` seconds.
pub(super) fn silent(m: &mut Machine, now: Timestamp, s: i64) {
    m.state = if s > GRACE {
        MachineState::Unreachable
    } else {
        m.state
    };
    m.since = ago(now, (s - GRACE).max(0));
    m.last_report_at = Some(ago(now, s));
}

/// Agent, Lease and Ready all gone for `s` seconds.
pub(super) fn dead(m: &mut Machine, now: Timestamp, s: i64) {
    silent(m, now, s);
    m.node.as_mut().unwrap().lease_renewed_at = Some(ago(now, s));
    set_condition(m, now, "Ready", "Unknown", (s - 40).max(0));
}

/// Sets (or adds) a Node condition.
pub(super) fn set_condition(m: &mut Machine, now: Timestamp, t: &str, status: &str, s: i64) {
    let n = m.node.as_mut().expect("a node");
    n.conditions.retain(|c| c.type_ != t);
    n.conditions.push(Condition {
        type_: t.to_string(),
        status: status.to_string(),
        since: ago(now, s),
    });
}
