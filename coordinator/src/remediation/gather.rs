//! From the coordinator's live state to the core's [`Input`]: the fleet snapshot, the
//! Kubernetes node view, the repair queue's entries, and what the loop remembers (recent
//! admissions, repair outcomes, operator switches). Pure: no I/O, no clock.
//!
//! A machine's Node is the one whose InternalIP is the machine's address, else the one named
//! like its hostname. Without `[kubernetes]` there is no view at all (`Input::kube` is
//! `None`), which the core reads as "the agent signal alone counts".

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use protocol::admin::repair::RepairEntry;

use super::decision::Decision;
use super::input::{
    Condition, Control, Dump, FailingCheck, Input, KubeFacts, Machine, NodeFacts, QueueEntry,
    RepairOutcome,
};
use crate::clock::from_unix_ms;
use crate::fence::kdump::{DumpSeen, KdumpView};
use crate::fleet::{FleetSnapshot, MachineSnapshot};
use crate::k8s::view::{NodeSnapshot, NodeViewSnapshot};

/// The Kubernetes view for one pass and how old it may be.
#[derive(Debug, Clone, Copy)]
pub struct ViewFacts<'a> {
    /// The current snapshot.
    pub snapshot: &'a NodeViewSnapshot,
    /// The freshness limit.
    pub max_age: Duration,
}

/// Builds one pass's input.
pub fn input(
    fleet: &FleetSnapshot,
    view: Option<ViewFacts<'_>>,
    queue: &[RepairEntry],
    history: Vec<Decision>,
    outcomes: Vec<RepairOutcome>,
    control: Control,
) -> Input {
    let (by_ip, by_name) = match view {
        Some(v) => {
            let mut by_ip = HashMap::with_capacity(v.snapshot.nodes.len());
            for n in v.snapshot.nodes.values() {
                if let Some(ip) = &n.internal_ip {
                    by_ip.insert(ip.as_str(), n);
                }
            }
            (by_ip, Some(&v.snapshot.nodes))
        }
        None => (HashMap::new(), None),
    };
    let fallback = view.and_then(|v| v.snapshot.refreshed_at);
    let machines = fleet
        .machines
        .iter()
        .map(|m| {
            let node = by_ip
                .get(m.record.address.as_str())
                .copied()
                .or_else(|| by_name.and_then(|nodes| nodes.get(&m.record.hostname)));
            machine(m, node.map(|n| node_facts(n, fallback)))
        })
        .collect();
    Input {
        machines,
        kube: view.map(|v| KubeFacts {
            refreshed_at: v.snapshot.refreshed_at,
            max_age: v.max_age,
        }),
        queue: queue
            .iter()
            .filter(|e| !e.deleted)
            .map(|e| QueueEntry {
                index: e.index,
                address: e.address.clone(),
                operation: e.operation.clone(),
                status: e.status,
                last_transition: from_unix_ms(
                    i64::try_from(e.last_transition_time_unix_ms).unwrap_or(0),
                ),
            })
            .collect(),
        history,
        outcomes,
        control,
        sabakan: None,
    }
}

fn machine(m: &MachineSnapshot, node: Option<NodeFacts>) -> Machine {
    Machine {
        address: m.record.address.clone(),
        serial: m.record.serial.clone(),
        rack: m.record.rack.clone(),
        role: m.record.role.clone(),
        machine_type: m.record.machine_type.clone(),
        labels: m.record.labels.clone(),
        state: m.state,
        since: m.since,
        last_report_at: m.last_report_at,
        failing_checks: m
            .failing
            .iter()
            .map(|(name, since)| {
                let kind = name.split(':').next().unwrap_or("");
                FailingCheck {
                    name: name.clone(),
                    since: *since,
                    // A snapshot taken between the two maps' updates cannot exist (one
                    // lock); the check's own start is the safe fallback all the same.
                    kind_since: m
                        .failing_kinds
                        .get(kind)
                        .copied()
                        .map_or(*since, |k| k.min(*since)),
                }
            })
            .collect(),
        goodbye: m.goodbye,
        kdump_loaded: m.kdump_loaded,
        dump: Dump::None,
        booted_at: m.boot_seen_at,
        node,
        last_silence: m.last_silence,
    }
}

/// Fills in what each machine's kdump initramfs last said (the registry is read apart from
/// the fleet snapshot; both are in memory).
pub fn add_dumps(input: &mut Input, kdump: &dyn KdumpView) {
    for m in &mut input.machines {
        m.dump = match kdump.dump(&m.address) {
            DumpSeen::None => Dump::None,
            DumpSeen::Dumping { started, .. } => Dump::Dumping { since: started },
            DumpSeen::Done { at } => Dump::Done { at },
        };
    }
}

/// A condition without a transition time counts from the view's refresh: the oldest it can
/// be shown to be.
pub(super) fn node_facts(n: &NodeSnapshot, fallback: Option<Timestamp>) -> NodeFacts {
    NodeFacts {
        name: n.name.clone(),
        lease_renewed_at: n.lease_renew_time,
        lease_seen_since: n.lease_seen_since,
        conditions: n
            .conditions
            .iter()
            .map(|c| Condition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                since: c
                    .last_transition
                    .or(fallback)
                    .unwrap_or(Timestamp::UNIX_EPOCH),
            })
            .collect(),
    }
}

/// Repair outcomes of the finished entries in `queue` whose index is not in `known`.
pub fn finished(
    queue: &[RepairEntry],
    known: &std::collections::HashSet<u64>,
) -> Vec<(u64, RepairOutcome)> {
    queue
        .iter()
        .filter(|e| e.status.is_finished() && !known.contains(&e.index))
        .map(|e| {
            (
                e.index,
                RepairOutcome {
                    address: e.address.clone(),
                    finished_at: from_unix_ms(
                        i64::try_from(e.last_transition_time_unix_ms).unwrap_or(0),
                    ),
                    succeeded: e.status == protocol::admin::repair::RepairStatus::Succeeded,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use protocol::admin::repair::{RepairStatus, RepairStepStatus};

    use super::*;
    use crate::health::MachineState;
    use crate::inventory::{MachineRecord, RecordSource};
    use crate::k8s::view::NodeConditionView;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn snap(address: &str, hostname: &str) -> MachineSnapshot {
        MachineSnapshot {
            record: MachineRecord {
                address: address.into(),
                hostname: hostname.into(),
                serial: "s1".into(),
                rack: "r1".into(),
                role: "cs".into(),
                machine_type: Some("qemu".into()),
                labels: BTreeMap::new(),
                source: RecordSource::Inventory,
            },
            state: MachineState::Unreachable,
            since: t(10),
            reason: String::new(),
            last_report_at: Some(t(5)),
            boot_id: Some("b".into()),
            boot_seen_at: Some(t(1)),
            last_silence: None,
            kdump_loaded: true,
            failing: BTreeMap::from([("kubelet:kubelet".to_string(), t(3))]),
            failing_kinds: BTreeMap::from([("kubelet".to_string(), t(2))]),
            goodbye: None,
            connected: false,
        }
    }

    fn node(name: &str, ip: Option<&str>) -> NodeSnapshot {
        NodeSnapshot {
            name: name.into(),
            uid: "u".into(),
            internal_ip: ip.map(str::to_string),
            ready: Some(false),
            conditions: vec![NodeConditionView {
                type_: "Ready".into(),
                status: "Unknown".into(),
                reason: None,
                last_transition: None,
            }],
            taints: vec![],
            unschedulable: false,
            cordoned_by_us: false,
            lease_renew_time: Some(t(4)),
            lease_seen_since: Some(t(5)),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn machines_find_their_node_by_ip_then_by_hostname() {
        let fleet = FleetSnapshot {
            taken_at: Some(t(20)),
            machines: vec![
                snap("10.0.0.1", "n1"),
                snap("10.0.0.2", "n2"),
                snap("10.0.0.3", "n3"),
            ],
        };
        let view = NodeViewSnapshot {
            nodes: BTreeMap::from([
                ("other".to_string(), node("other", Some("10.0.0.1"))),
                ("n2".to_string(), node("n2", None)),
            ]),
            refreshed_at: Some(t(19)),
        };
        let v = ViewFacts {
            snapshot: &view,
            max_age: Duration::from_secs(30),
        };
        let i = input(&fleet, Some(v), &[], vec![], vec![], Control::default());
        let names: Vec<_> = i
            .machines
            .iter()
            .map(|m| m.node.as_ref().map(|n| n.name.as_str()))
            .collect();
        assert_eq!(names, [Some("other"), Some("n2"), None]);
        let m = &i.machines[0];
        let n = m.node.as_ref().unwrap();
        assert_eq!(n.lease_renewed_at, Some(t(4)));
        assert_eq!(n.lease_seen_since, Some(t(5)));
        // No transition time: the view's refresh is the oldest the condition can be shown to be.
        assert_eq!(n.ready().unwrap().since, t(19));
        assert_eq!(m.failing_checks[0].name, "kubelet:kubelet");
        assert!(m.failing_checks[0].is("kubelet"));
        assert_eq!(m.booted_at, Some(t(1)));
        assert!(m.kdump_loaded);
        assert_eq!(i.kube.unwrap().refreshed_at, Some(t(19)));
        let none = input(&fleet, None, &[], vec![], vec![], Control::default());
        assert!(none.kube.is_none() && none.machines.iter().all(|m| m.node.is_none()));
    }

    #[test]
    fn deleted_entries_leave_the_queue_and_finished_ones_become_outcomes_once() {
        let entry = |index, status, deleted| RepairEntry {
            index,
            address: format!("10.0.0.{index}"),
            nodename: String::new(),
            serial: String::new(),
            machine_type: "qemu".into(),
            operation: "unhealthy".into(),
            status,
            step: 0,
            step_status: RepairStepStatus::Waiting,
            deleted,
            last_transition_time_unix_ms: 1_800_000_000_000,
            drain_backoff_count: 0,
            drain_backoff_expire_unix_ms: 0,
        };
        let q = vec![
            entry(1, RepairStatus::Queued, false),
            entry(2, RepairStatus::Succeeded, true),
            entry(3, RepairStatus::Failed, false),
        ];
        let fleet = FleetSnapshot::default();
        let i = input(&fleet, None, &q, vec![], vec![], Control::default());
        assert_eq!(i.queue.len(), 2);
        let known = std::collections::HashSet::from([3]);
        let f = finished(&q, &known);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, 2);
        assert!(f[0].1.succeeded);
    }

    #[test]
    #[ignore = "benchmark: run by name with --ignored --nocapture"]
    fn bench_gather_over_ten_thousand_machines() {
        let mut machines = Vec::new();
        let mut nodes = BTreeMap::new();
        for i in 0..10_000u32 {
            let (addr, host) = (
                format!("10.{}.{}.{}", i / 65536, i / 256 % 256, i % 256),
                format!("n{i}"),
            );
            machines.push(snap(&addr, &host));
            nodes.insert(host.clone(), node(&host, Some(&addr)));
        }
        machines.sort_by(|a, b| a.record.address.cmp(&b.record.address));
        let fleet = FleetSnapshot {
            taken_at: Some(t(20)),
            machines,
        };
        let view = NodeViewSnapshot {
            nodes,
            refreshed_at: Some(t(19)),
        };
        let v = ViewFacts {
            snapshot: &view,
            max_age: Duration::from_secs(30),
        };
        let passes = 50;
        let start = std::time::Instant::now();
        for _ in 0..passes {
            std::hint::black_box(input(
                &fleet,
                Some(v),
                &[],
                vec![],
                vec![],
                Control::default(),
            ));
        }
        let per = start.elapsed() / passes;
        println!(
            "gather over 10,000 machines and 10,000 Nodes: {:.3} ms per pass",
            per.as_secs_f64() * 1e3
        );
    }

    #[test]
    fn dumps_come_from_the_kdump_view_per_machine() {
        struct View;
        impl KdumpView for View {
            fn dump(&self, address: &str) -> DumpSeen {
                match address {
                    "10.0.0.1" => DumpSeen::Dumping {
                        started: t(7),
                        timeout: Duration::from_secs(600),
                    },
                    "10.0.0.2" => DumpSeen::Done { at: t(8) },
                    _ => DumpSeen::None,
                }
            }
        }
        let fleet = FleetSnapshot {
            taken_at: Some(t(20)),
            machines: vec![
                snap("10.0.0.1", "n1"),
                snap("10.0.0.2", "n2"),
                snap("10.0.0.3", "n3"),
            ],
        };
        let mut i = input(&fleet, None, &[], vec![], vec![], Control::default());
        assert!(i.machines.iter().all(|m| m.dump == Dump::None));
        add_dumps(&mut i, &View);
        let dumps: Vec<_> = i.machines.iter().map(|m| m.dump).collect();
        assert_eq!(
            dumps,
            [
                Dump::Dumping { since: t(7) },
                Dump::Done { at: t(8) },
                Dump::None
            ]
        );
    }
}
