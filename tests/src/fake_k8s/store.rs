//! The fake API server's object store and the little of the control plane it simulates.
//!
//! Objects are kept as JSON, the way they travel, keyed by resource, namespace and name.
//! Every write bumps one global resourceVersion. Time-based behaviour (pods that take a
//! while to terminate and never end on a node that is not Ready, taint eviction and the pod
//! GC after a Node is deleted or marked out of service and not Ready, the attach-detach
//! controller removing VolumeAttachments) is applied lazily by [`State::sweep`]
//! at the start of every request and inspection, so there are no background tasks to race.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A resource the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Res {
    Node,
    Pod,
    Namespace,
    Event,
    Pdb,
    VolumeAttachment,
    Lease,
}

impl Res {
    pub(crate) const ALL: [Res; 7] = [
        Res::Node,
        Res::Pod,
        Res::Namespace,
        Res::Event,
        Res::Pdb,
        Res::VolumeAttachment,
        Res::Lease,
    ];

    /// (group, version, plural, kind, namespaced)
    pub(crate) fn info(self) -> (&'static str, &'static str, &'static str, &'static str, bool) {
        match self {
            Res::Node => ("", "v1", "nodes", "Node", false),
            Res::Pod => ("", "v1", "pods", "Pod", true),
            Res::Namespace => ("", "v1", "namespaces", "Namespace", false),
            Res::Event => ("", "v1", "events", "Event", true),
            Res::Pdb => (
                "policy",
                "v1",
                "poddisruptionbudgets",
                "PodDisruptionBudget",
                true,
            ),
            Res::VolumeAttachment => (
                "storage.k8s.io",
                "v1",
                "volumeattachments",
                "VolumeAttachment",
                false,
            ),
            Res::Lease => ("coordination.k8s.io", "v1", "leases", "Lease", true),
        }
    }

    pub(crate) fn api_version(self) -> String {
        let (g, v, ..) = self.info();
        if g.is_empty() {
            v.to_string()
        } else {
            format!("{g}/{v}")
        }
    }

    pub(crate) fn kind(self) -> &'static str {
        self.info().3
    }

    pub(crate) fn plural(self) -> &'static str {
        self.info().2
    }

    pub(crate) fn namespaced(self) -> bool {
        self.info().4
    }

    pub(crate) fn lookup(group: &str, version: &str, plural: &str) -> Option<Res> {
        Res::ALL.into_iter().find(|r| {
            let (g, v, p, ..) = r.info();
            g == group && v == version && p == plural
        })
    }

    /// Field selector labels the real API server supports for this resource.
    pub(crate) fn field_labels(self) -> &'static [&'static str] {
        match self {
            Res::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Res::Node => &["metadata.name", "spec.unschedulable"],
            Res::Event => &[
                "metadata.name",
                "metadata.namespace",
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            Res::Namespace => &["metadata.name", "status.phase"],
            _ => &["metadata.name", "metadata.namespace"],
        }
    }
}

/// Key of a stored object.
pub(crate) type Key = (Res, String, String);

/// Pending time-based removals.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// Pod (namespace, name, uid) → when it disappears.
    pub(crate) pod_gone_at: HashMap<(String, String, String), Instant>,
    /// VolumeAttachment name → when it disappears.
    pub(crate) va_gone_at: HashMap<String, Instant>,
}

/// The whole state.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) objects: BTreeMap<Key, Value>,
    /// The resource version each object was created at (watch tells ADDED from MODIFIED).
    pub(crate) created_rv: HashMap<Key, u64>,
    pub(crate) rv: u64,
    uid_seq: u64,
    pub(crate) timers: Timers,
    /// How long a pod with no configured delay takes to go after a graceful delete.
    pub(crate) default_termination: Duration,
    /// Per-pod termination time after a graceful delete, by (namespace, name).
    pub(crate) termination: HashMap<(String, String), Duration>,
    /// How long the simulated pod GC / attach-detach controller take to act.
    pub(crate) gc_delay: Duration,
    /// Reported server version (major, minor).
    pub(crate) version: (String, String),
    /// Nodes whose simulated kubelet was marked dead ([`super::FakeK8s::set_kubelet_alive`]):
    /// it ends no graceful termination even while its Node still reports Ready (the node
    /// lifecycle controller has not noticed yet), as on a real cluster.
    pub(crate) dead_kubelets: std::collections::BTreeSet<String>,
}

/// The out-of-service taint key.
pub(crate) const OOS_KEY: &str = "node.kubernetes.io/out-of-service";

pub(crate) fn now_rfc3339() -> String {
    jiff_like_now()
}

/// RFC 3339 "now" with microsecond precision, as Lease `renewTime` (a MicroTime) carries.
pub(crate) fn now_rfc3339_micros() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = rfc3339(d.as_secs());
    format!("{}.{:06}Z", s.trim_end_matches('Z'), d.subsec_micros())
}

/// RFC 3339 "now" with second precision, without pulling a time crate into the test kit.
fn jiff_like_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if mo <= 2 { y + 1 } else { y };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

impl State {
    pub(crate) fn new() -> Self {
        let mut s = Self {
            objects: BTreeMap::new(),
            created_rv: HashMap::new(),
            rv: 1,
            uid_seq: 0,
            timers: Timers::default(),
            default_termination: Duration::ZERO,
            termination: HashMap::new(),
            gc_delay: Duration::from_millis(50),
            version: ("1".into(), "33".into()),
            dead_kubelets: Default::default(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            s.insert_new(
                Res::Namespace,
                json!({"metadata": {"name": ns}, "status": {"phase": "Active"}}),
            );
        }
        s
    }

    pub(crate) fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    pub(crate) fn new_uid(&mut self) -> String {
        self.uid_seq += 1;
        let r: u64 = rand::random();
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (r >> 32) as u32,
            (r >> 16) as u16,
            self.uid_seq & 0xfff,
            (r >> 4) & 0xfff,
            self.uid_seq
        )
    }

    pub(crate) fn key_of(res: Res, obj: &Value) -> Key {
        let ns = if res.namespaced() {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        (
            res,
            ns,
            obj["metadata"]["name"].as_str().unwrap_or_default().into(),
        )
    }

    /// Stores a new object, filling server-set metadata. Overwrites silently (seeding).
    pub(crate) fn insert_new(&mut self, res: Res, mut obj: Value) -> Value {
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind());
        if res.namespaced() && obj["metadata"]["namespace"].is_null() {
            obj["metadata"]["namespace"] = json!("default");
        }
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(self.new_uid());
        }
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
        }
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv);
        let key = Self::key_of(res, &obj);
        if !self.objects.contains_key(&key) {
            self.created_rv.insert(key.clone(), rv.parse().unwrap_or(0));
        }
        self.objects.insert(key, obj.clone());
        obj
    }

    pub(crate) fn get(&self, res: Res, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(res, ns.to_string(), name.to_string()))
    }

    pub(crate) fn remove(&mut self, res: Res, ns: &str, name: &str) -> Option<Value> {
        self.next_rv();
        let key = (res, ns.to_string(), name.to_string());
        self.created_rv.remove(&key);
        self.objects.remove(&key)
    }

    pub(crate) fn list(&self, res: Res, ns: Option<&str>) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v)
            .collect()
    }

    /// Starts a graceful pod deletion (or removes at once when `grace` is zero or the pod
    /// takes no time to terminate). Returns the object as it now is.
    pub(crate) fn delete_pod(&mut self, ns: &str, name: &str, grace: Option<u64>) -> Option<Value> {
        let pod = self.get(Res::Pod, ns, name)?.clone();
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let delay = self
            .termination
            .get(&(ns.to_string(), name.to_string()))
            .copied()
            .unwrap_or(self.default_termination);
        let unscheduled = pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .is_empty();
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        // A node that is not Ready, or whose kubelet died, has no kubelet to end a graceful
        // termination: the pod stays terminating until the pod GC (or a force delete)
        // removes it.
        let kubelet_gone = !unscheduled && !self.kubelet_runs(node);
        if grace == Some(0) || unscheduled || (delay.is_zero() && !kubelet_gone) {
            self.timers
                .pod_gone_at
                .remove(&(ns.to_string(), name.to_string(), uid));
            return self.remove(Res::Pod, ns, name);
        }
        let rv = self.next_rv();
        let key = (Res::Pod, ns.to_string(), name.to_string());
        let obj = self.objects.get_mut(&key).expect("pod present");
        if obj["metadata"]["deletionTimestamp"].is_null() {
            let grace = grace
                .or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_u64())
                .unwrap_or(30);
            obj["metadata"]["deletionTimestamp"] = json!(rfc3339(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
                    + grace
            ));
            obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            obj["metadata"]["resourceVersion"] = json!(rv);
            if !kubelet_gone {
                self.timers.pod_gone_at.insert(
                    (ns.to_string(), name.to_string(), uid),
                    Instant::now() + delay,
                );
            }
        }
        Some(obj.clone())
    }

    /// The Node carries the out-of-service NoExecute taint.
    fn node_out_of_service(&self, node: &str) -> bool {
        self.get(Res::Node, "", node).is_some_and(|n| {
            n["spec"]["taints"].as_array().is_some_and(|ts| {
                ts.iter()
                    .any(|t| t["key"] == OOS_KEY && t["effect"] == "NoExecute")
            })
        })
    }

    /// The node's kubelet runs: its Node reports Ready and the test has not marked its
    /// simulated kubelet dead (a real Node stays Ready for the node monitor grace period
    /// after its kubelet died).
    fn kubelet_runs(&self, node: &str) -> bool {
        self.node_ready(node) && !self.dead_kubelets.contains(node)
    }

    /// The Node's Ready condition is True (its kubelet reports): the real pod GC never
    /// force-deletes the pods of such a node, and a kubelet ends their graceful termination.
    fn node_ready(&self, node: &str) -> bool {
        self.get(Res::Node, "", node).is_some_and(|n| {
            n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    }

    /// Applies everything that is due.
    ///
    /// The controllers simulated here follow the real ones (kube-controller-manager 1.37,
    /// checked side by side in tests/tests/real_k8s_compare.rs), only faster:
    /// - taint eviction: a pod of a node with the out-of-service NoExecute taint that does
    ///   not tolerate it is deleted gracefully (it becomes terminating);
    /// - graceful termination ends (the pod goes) only while its node is Ready: a kubelet
    ///   that is gone stops nothing, so a dead node's pods stay terminating;
    /// - pod GC: a terminating pod of a node that is out of service *and* not Ready is
    ///   force-deleted, and a pod of a deleted Node is removed, after `gc_delay` (the real
    ///   pod GC looks every 20 s, and waits 40 s for a deleted Node's pods);
    /// - attach-detach: a VolumeAttachment of a node that is deleted or out of service goes
    ///   `gc_delay` after the last pod of that node went.
    pub(crate) fn sweep(&mut self) {
        let now = Instant::now();
        // Terminated pods disappear.
        let due: Vec<(String, String, String)> = self
            .timers
            .pod_gone_at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name, uid) in due {
            self.timers
                .pod_gone_at
                .remove(&(ns.clone(), name.clone(), uid.clone()));
            if self
                .get(Res::Pod, &ns, &name)
                .is_some_and(|p| p["metadata"]["uid"] == uid.as_str())
            {
                self.remove(Res::Pod, &ns, &name);
            }
        }
        let key_of = |p: &Value| {
            (
                p["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        };
        // A kubelet back (its node Ready again) ends the graceful terminations it missed.
        let resumed: Vec<(String, String, String)> = self
            .list(Res::Pod, None)
            .into_iter()
            .filter(|p| {
                !p["metadata"]["deletionTimestamp"].is_null()
                    && p["spec"]["nodeName"]
                        .as_str()
                        .is_some_and(|n| self.kubelet_runs(n))
            })
            .map(key_of)
            .filter(|k| !self.timers.pod_gone_at.contains_key(k))
            .collect();
        for key in resumed {
            let delay = self
                .termination
                .get(&(key.0.clone(), key.1.clone()))
                .copied()
                .unwrap_or(self.default_termination);
            self.timers.pod_gone_at.insert(key, now + delay);
        }
        // Taint eviction.
        let evict: Vec<(String, String)> = self
            .list(Res::Pod, None)
            .into_iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && !tolerates_out_of_service(p)
                    && p["spec"]["nodeName"]
                        .as_str()
                        .is_some_and(|n| self.node_out_of_service(n))
            })
            .map(|p| {
                let (ns, name, _) = key_of(p);
                (ns, name)
            })
            .collect();
        for (ns, name) in evict {
            self.delete_pod(&ns, &name, None);
        }
        // Pod GC.
        let orphans: Vec<(String, String, String)> = self
            .list(Res::Pod, None)
            .into_iter()
            .filter(|p| {
                let Some(node) = p["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
                    return false;
                };
                let node_gone = self.get(Res::Node, "", node).is_none();
                let terminating = !p["metadata"]["deletionTimestamp"].is_null();
                node_gone
                    || (terminating && self.node_out_of_service(node) && !self.node_ready(node))
            })
            .map(key_of)
            .collect();
        for key in orphans {
            let at = now + self.gc_delay;
            let entry = self.timers.pod_gone_at.entry(key).or_insert(at);
            // A graceful end the kubelet would have brought is not waited for.
            if *entry > at {
                *entry = at;
            }
        }
        let vas: Vec<String> = self
            .list(Res::VolumeAttachment, None)
            .into_iter()
            .filter(|va| {
                va["spec"]["nodeName"].as_str().is_some_and(|n| {
                    (self.get(Res::Node, "", n).is_none() || self.node_out_of_service(n))
                        && !self
                            .list(Res::Pod, None)
                            .iter()
                            .any(|p| p["spec"]["nodeName"] == n)
                })
            })
            .filter_map(|va| va["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        for name in vas {
            let at = *self
                .timers
                .va_gone_at
                .entry(name.clone())
                .or_insert(now + self.gc_delay);
            if at <= now {
                self.timers.va_gone_at.remove(&name);
                self.remove(Res::VolumeAttachment, "", &name);
            }
        }
    }
}

/// The pod tolerates the out-of-service NoExecute taint (key match, or an `Exists`
/// toleration with no key), so taint eviction leaves it.
fn tolerates_out_of_service(pod: &Value) -> bool {
    pod["spec"]["tolerations"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            let key_ok = t["key"] == OOS_KEY
                || (t["key"].as_str().unwrap_or_default().is_empty() && t["operator"] == "Exists");
            let effect_ok =
                t["effect"].is_null() || t["effect"] == "" || t["effect"] == "NoExecute";
            key_ok && effect_ok
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
