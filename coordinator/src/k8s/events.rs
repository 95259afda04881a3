//! Kubernetes Events on the Node for every remediation step, so `kubectl describe node`
//! shows what Fleetmend did and why.
//!
//! Events are core/v1 Events (what `kubectl describe` lists) in the `default` namespace,
//! the namespace the kubelet uses for Node events, with `involvedObject` naming the Node.
//! Recording is best effort: a failed Event is logged and never fails or delays a repair.
//! This module deliberately does not aggregate or rate-limit Events (the drainer dedupes the
//! one Event that could repeat, "blocked by a budget").

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};

use crate::clock::Clock;

/// The namespace Node events live in, as with the kubelet's own.
pub const EVENT_NAMESPACE: &str = "default";

/// The component named as the Event source.
pub const COMPONENT: &str = "fleetmend-coordinator";

/// A remediation step worth an Event on the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeEvent {
    /// Fleetmend cordoned the node.
    Cordoned,
    /// Fleetmend removed its own cordon.
    Uncordoned,
    /// Every pod that had to leave has left.
    Drained,
    /// A PodDisruptionBudget refused an eviction.
    DrainBlockedByBudget,
    /// The drain was abandoned (protected Job pod, several budgets, forbidden).
    DrainAbandoned,
    /// The machine was fenced (confirmed powered off).
    Fenced,
    /// The node's workload was released (taint or Node deletion).
    Released,
    /// The taint was removed or the Node's metadata restored.
    Restored,
    /// The repair succeeded.
    Repaired,
    /// The repair failed.
    Failed,
    /// Automatic remediation admitted a repair for the machine.
    RemediationAdmitted,
    /// Automatic remediation held a repair for the machine (a limit, a gate, a pause).
    RemediationHeld,
    /// The machine's agent is silent while its kubelet still renews its Lease.
    AgentLostNodeAlive,
    /// The machine's kdump initramfs says a crash dump is being written.
    KdumpStarted,
    /// The machine's kdump initramfs says the crash dump is written.
    KdumpDone,
    /// A coordinator that started or took the lead resumed the node's fence flow where the
    /// store had it.
    FenceResumed,
}

impl NodeEvent {
    /// The Event's `reason` (CamelCase, as Kubernetes reasons are).
    pub fn reason(self) -> &'static str {
        match self {
            NodeEvent::Cordoned => "FleetmendCordoned",
            NodeEvent::Uncordoned => "FleetmendUncordoned",
            NodeEvent::Drained => "FleetmendDrained",
            NodeEvent::DrainBlockedByBudget => "FleetmendDrainBlockedByBudget",
            NodeEvent::DrainAbandoned => "FleetmendDrainAbandoned",
            NodeEvent::Fenced => "FleetmendFenced",
            NodeEvent::Released => "FleetmendReleased",
            NodeEvent::Restored => "FleetmendRestored",
            NodeEvent::Repaired => "FleetmendRepaired",
            NodeEvent::Failed => "FleetmendRepairFailed",
            NodeEvent::RemediationAdmitted => "FleetmendRemediationAdmitted",
            NodeEvent::RemediationHeld => "FleetmendRemediationHeld",
            NodeEvent::AgentLostNodeAlive => "FleetmendAgentLostNodeAlive",
            NodeEvent::KdumpStarted => "FleetmendKdumpStarted",
            NodeEvent::KdumpDone => "FleetmendKdumpDone",
            NodeEvent::FenceResumed => "FleetmendFenceResumed",
        }
    }

    /// `Normal` or `Warning`.
    pub fn event_type(self) -> &'static str {
        match self {
            NodeEvent::DrainBlockedByBudget
            | NodeEvent::DrainAbandoned
            | NodeEvent::Failed
            | NodeEvent::RemediationHeld
            | NodeEvent::AgentLostNodeAlive
            | NodeEvent::KdumpStarted => "Warning",
            _ => "Normal",
        }
    }
}

/// Posts Events about Nodes.
#[derive(Clone)]
pub struct EventRecorder {
    api: Api<Event>,
    instance: String,
    seq: std::sync::Arc<AtomicU64>,
    clock: std::sync::Arc<dyn Clock>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("instance", &self.instance)
            .finish()
    }
}

impl EventRecorder {
    /// A recorder posting through `client`; `instance` names this coordinator, `clock`
    /// stamps the Events.
    pub fn new(
        client: kube::Client,
        instance: impl Into<String>,
        clock: std::sync::Arc<dyn Clock>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, EVENT_NAMESPACE),
            instance: instance.into(),
            seq: Default::default(),
            clock,
        }
    }

    /// Records `event` on `node` (whose UID is `node_uid` when known). Never fails.
    pub async fn record(
        &self,
        node: &str,
        node_uid: Option<&str>,
        event: NodeEvent,
        message: &str,
    ) {
        let now = self.clock.now();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        // Unique per coordinator instance: node name, time in ns, a sequence number.
        let name = format!(
            "{node}.fleetmend.{:x}.{seq:x}",
            now.as_nanosecond().unsigned_abs()
        );
        // Kubernetes caps message length at 1 KiB in events.k8s.io; stay under it.
        let message: String = message.chars().take(1000).collect();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(EVENT_NAMESPACE.into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid: node_uid.map(str::to_string),
                ..Default::default()
            },
            reason: Some(event.reason().into()),
            message: Some(message),
            type_: Some(event.event_type().into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(event.reason().trim_start_matches("Fleetmend").into()),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.instance.clone()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: None,
            }),
            ..Default::default()
        };
        match self.api.create(&PostParams::default(), &ev).await {
            Ok(_) => tracing::debug!(node, reason = event.reason(), "event recorded"),
            Err(error) => {
                tracing::warn!(%error, node, reason = event.reason(), "could not record Kubernetes Event")
            }
        }
    }
}
