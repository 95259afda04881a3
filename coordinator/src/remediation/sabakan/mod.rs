//! Auto-repair's machines from a real sabakan instead of the built-in inventory
//! (`[remediation.auto_repair] source = "sabakan"`).
//!
//! A poller ([`SabakanSource::run`]) asks sabakan's GraphQL `searchMachines(having,
//! notHaving)` every interval, off the remediation loop, and keeps the last answer and the
//! last error. Each pass turns them into [`SabakanFacts`] ([`SabakanSource::facts`]): the
//! machines sabakan returned as the core's [`Machine`]s (address `spec.ipv4[0]`, machine
//! type `spec.bmc.bmcType`, state `status.state`, since `status.timestamp`). The pure core
//! ([`auto_repair_machines`]) then either uses them or holds auto-repair with the reason.
//!
//! What it deliberately does not do:
//! - It never decides from an old answer: the last attempt failed, no answer yet, an answer
//!   older than its freshness limit, or one asked with other `having` / `notHaving` than
//!   those in force, and auto-repair holds (one journal line naming sabakan) instead.
//! - It never blocks the loop: a slow or dead sabakan delays only the poller, so the health
//!   checks, the limits and everything outside remediation go on at their pace.
//! - It replaces only auto-repair's machines. The health checks, two-signal death's
//!   Kubernetes view and the storm limits keep reading the coordinator's own registry.

pub mod client;
pub mod config;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use self::client::{SabakanClient, SabakanError, SabakanMachine};
pub use self::config::{DEFAULT_TIMEOUT, SabakanConfig, Source};
use super::config::{AutoRepair, RemediationConfigError};
use super::decision::{LimitStatus, Rule};
use super::gather::ViewFacts;
use super::input::{Input, Machine, SabakanFacts};
use super::shared::Shared;
use super::{elapsed, human};

/// An answer may be this many poll intervals old (plus one request timeout) before
/// auto-repair holds: one slow answer is not an outage, three missed ones are.
pub const MAX_AGE_INTERVALS: u32 = 3;

/// The address of the journal line that holds auto-repair for sabakan: the hold is about
/// the source, not one machine.
pub const JOURNAL_ADDRESS: &str = "sabakan";

/// Checks the auto-repair source settings; the error names the key.
pub fn validate(ar: &AutoRepair) -> Result<(), RemediationConfigError> {
    let err = |key: &str, message: String| {
        Err(RemediationConfigError::Invalid {
            key: format!("auto_repair.{key}"),
            message,
        })
    };
    match (ar.source, &ar.sabakan) {
        (Source::Inventory, _) => Ok(()),
        (Source::Sabakan, None) => err(
            "sabakan",
            "source = \"sabakan\" needs [remediation.auto_repair.sabakan] with its url".into(),
        ),
        (Source::Sabakan, Some(s)) => {
            if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
                return err("sabakan.url", format!("{:?} is not an http(s) URL", s.url));
            }
            if s.url.starts_with("https://") && s.ca_file.is_none() {
                return err(
                    "sabakan.ca_file",
                    "an https URL needs the CA that signed sabakan's certificate".into(),
                );
            }
            if s.timeout.is_zero() {
                return err("sabakan.timeout", "must be greater than 0".into());
            }
            if let Err(e) = client::variables(&ar.having, &ar.not_having) {
                let (key, message) = e.split_once(": ").unwrap_or(("having", e.as_str()));
                return err(key, message.to_string());
            }
            Ok(())
        }
    }
}

/// auto-repair's machines in this pass: the registry's, or sabakan's last answer while it
/// is fresh. `Err(sentence)` holds auto-repair.
pub(super) fn auto_repair_machines(input: &Input, now: Timestamp) -> Result<&[Machine], String> {
    let Some(s) = &input.sabakan else {
        return Ok(&input.machines);
    };
    let why = match (&s.error, &s.read) {
        (Some(e), _) => format!("cannot be read: {e}"),
        (None, None) => "has not answered yet (with the having/notHaving in force)".to_string(),
        (None, Some((at, _))) if elapsed(now, *at) > s.max_age => format!(
            "last answered {} ago (limit {})",
            human(elapsed(now, *at)),
            human(s.max_age)
        ),
        (None, Some((_, machines))) => return Ok(machines),
    };
    Err(format!(
        "held: auto-repair reads sabakan at {}, which {why}; nothing is enqueued from an old \
         answer",
        s.url
    ))
}

/// `remediation status`'s line for the source, when it is sabakan.
pub(super) fn status(input: &Input, enabled: bool, now: Timestamp) -> Option<LimitStatus> {
    let s = input.sabakan.as_ref()?;
    if !enabled {
        return Some(LimitStatus {
            rule: Rule::SabakanUnavailable,
            holding: false,
            sentence: format!("auto-repair is disabled; sabakan at {} is not read", s.url),
        });
    }
    Some(match auto_repair_machines(input, now) {
        Ok(m) => LimitStatus {
            rule: Rule::SabakanUnavailable,
            holding: false,
            sentence: format!(
                "sabakan at {} answered {} ago: {} having/notHaving",
                s.url,
                human(
                    s.read
                        .as_ref()
                        .map_or(Duration::ZERO, |(at, _)| elapsed(now, *at))
                ),
                match m.len() {
                    1 => "1 machine matches".to_string(),
                    n => format!("{n} machines match"),
                }
            ),
        },
        Err(sentence) => LimitStatus {
            rule: Rule::SabakanUnavailable,
            holding: true,
            sentence,
        },
    })
}

/// The last answer, with the variables it was asked with.
#[derive(Debug, Default)]
struct Latest {
    read: Option<(Timestamp, Value, Vec<SabakanMachine>)>,
    /// The last attempt's error, cleared by the next answer.
    error: Option<String>,
}

/// The poller's shared state: the client and what sabakan last said.
#[derive(Debug)]
pub struct SabakanSource {
    url: String,
    client: Result<SabakanClient, SabakanError>,
    latest: Mutex<Latest>,
    max_age: Duration,
}

impl SabakanSource {
    /// A source for `cfg`, polled every `interval`. A client that cannot be built (bad CA
    /// file) is kept as the error every pass holds with.
    pub fn new(cfg: &SabakanConfig, interval: Duration) -> Self {
        Self {
            url: cfg.url.clone(),
            client: SabakanClient::new(cfg),
            latest: Mutex::new(Latest::default()),
            max_age: interval * MAX_AGE_INTERVALS + cfg.timeout,
        }
    }

    fn latest(&self) -> std::sync::MutexGuard<'_, Latest> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks sabakan once with `ar`'s `having` / `not_having` and records the answer or the
    /// error. Returns true when the source went from failing (or unread) to answering or
    /// back, so the loop can run a pass at once.
    pub async fn poll(&self, ar: &AutoRepair, now: impl FnOnce() -> Timestamp) -> bool {
        let result = match (&self.client, client::variables(&ar.having, &ar.not_having)) {
            (Err(e), _) => Err(e.to_string()),
            (_, Err(e)) => Err(format!("the auto-repair variables cannot be sent: {e}")),
            (Ok(c), Ok(vars)) => c
                .search(&vars)
                .await
                .map(|m| (vars, m))
                .map_err(|e| e.to_string()),
        };
        let at = now();
        let mut l = self.latest();
        let was_ok = l.read.is_some() && l.error.is_none();
        match result {
            Ok((vars, machines)) => {
                tracing::debug!(url = %self.url, machines = machines.len(), "sabakan answered");
                l.read = Some((at, vars, machines));
                l.error = None;
            }
            Err(error) => {
                if l.error.as_ref() != Some(&error) {
                    tracing::warn!(url = %self.url, %error, "sabakan cannot be read; auto-repair holds");
                }
                l.error = Some(error);
            }
        }
        was_ok != (l.read.is_some() && l.error.is_none())
    }

    /// Polls every `interval` until `shutdown`, while auto-repair is enabled.
    pub(super) async fn run(self: Arc<Self>, shared: Arc<Shared>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(shared.base.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let cfg = shared.switches().effective(&shared.base);
            if !cfg.auto_repair.enabled {
                continue;
            }
            let changed = tokio::select! {
                _ = shutdown.cancelled() => break,
                c = self.poll(&cfg.auto_repair, || shared.clock.now()) => c,
            };
            if changed {
                shared.wake.notify_one();
            }
        }
    }

    /// This pass's facts: sabakan's last answer as the core's machines. An answer asked
    /// with other variables than `ar`'s counts as none. A machine the registry also holds
    /// keeps the registry's rack and labels (so the limits count its failure domain one
    /// way) and its agent's facts and Node; one only sabakan knows finds its Node by
    /// InternalIP.
    pub fn facts(
        &self,
        ar: &AutoRepair,
        registry: &[Machine],
        view: Option<ViewFacts<'_>>,
    ) -> SabakanFacts {
        let l = self.latest();
        let current = client::variables(&ar.having, &ar.not_having).ok();
        let read = l
            .read
            .as_ref()
            .filter(|(_, vars, _)| current.as_ref() == Some(vars))
            .map(|(at, _, recs)| (*at, machines(recs, registry, view)));
        SabakanFacts {
            url: self.url.clone(),
            read,
            error: l.error.clone(),
            max_age: self.max_age,
        }
    }
}

fn machines(
    recs: &[SabakanMachine],
    registry: &[Machine],
    view: Option<ViewFacts<'_>>,
) -> Vec<Machine> {
    let known: HashMap<&str, &Machine> = registry.iter().map(|m| (m.address.as_str(), m)).collect();
    let by_ip: HashMap<&str, _> = view
        .iter()
        .flat_map(|v| v.snapshot.nodes.values())
        .filter_map(|n| Some((n.internal_ip.as_deref()?, n)))
        .collect();
    let fallback = view.and_then(|v| v.snapshot.refreshed_at);
    recs.iter()
        .map(|r| {
            let mut m = match known.get(r.address.as_str()) {
                Some(k) => {
                    let mut m = (*k).clone();
                    for (name, value) in &r.labels {
                        m.labels
                            .entry(name.clone())
                            .or_insert_with(|| value.clone());
                    }
                    m
                }
                None => Machine {
                    rack: r.rack.to_string(),
                    labels: r.labels.clone(),
                    node: by_ip
                        .get(r.address.as_str())
                        .map(|n| super::gather::node_facts(n, fallback)),
                    ..Machine::unreported(&r.address, r.state, r.since)
                },
            };
            m.serial = r.serial.clone();
            m.role = r.role.clone();
            m.machine_type = Some(r.bmc_type.clone());
            m.state = r.state;
            m.since = r.since;
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::SignedDuration;

    use super::*;
    use crate::health::MachineState;
    use crate::remediation::config::{
        HealthCheck, RemediationConfig, Selector, UnhealthyCondition,
    };
    use crate::remediation::fixture::{self, Case, case};
    use crate::remediation::{Outcome, Rule};

    const URL: &str = "http://sabakan.test/graphql";

    /// A machine as sabakan's answer maps it: known only to sabakan.
    fn from_sabakan(address: &str, state: MachineState, since: Timestamp) -> Machine {
        Machine {
            machine_type: Some("IPMI-2.0".into()),
            state,
            since,
            last_report_at: None,
            node: None,
            booted_at: None,
            rack: "3".into(),
            ..fixture::healthy(address, "3", since)
        }
    }

    trait SabakanCase {
        fn sabakan(
            self,
            read_ago: Option<i64>,
            machines: Vec<Machine>,
            error: Option<&str>,
        ) -> Self;
    }

    impl SabakanCase for Case {
        fn sabakan(
            self,
            read_ago: Option<i64>,
            machines: Vec<Machine>,
            error: Option<&str>,
        ) -> Self {
            self.cfg(|c| {
                c.auto_repair.source = Source::Sabakan;
                c.auto_repair.sabakan = Some(SabakanConfig {
                    url: URL.into(),
                    timeout: DEFAULT_TIMEOUT,
                    ca_file: None,
                });
            })
            .input(|i, now| {
                i.sabakan = Some(SabakanFacts {
                    url: URL.into(),
                    read: read_ago.map(|s| (now - SignedDuration::from_secs(s), machines)),
                    error: error.map(str::to_string),
                    max_age: Duration::from_secs(40),
                })
            })
        }
    }

    #[test]
    fn sabakans_unhealthy_machine_becomes_an_entry_with_its_bmc_type_and_state() {
        let now = fixture::t0();
        let c = case().machine("10.0.0.1").failing("kubelet", 600).sabakan(
            Some(5),
            vec![from_sabakan(
                "10.0.0.9",
                MachineState::Unhealthy,
                now - SignedDuration::from_secs(120),
            )],
            None,
        );
        let p = c.run();
        // Only sabakan's machine: the registry's failing one is not auto-repair's business now.
        assert_eq!(p.admitted_addresses(), ["10.0.0.9"]);
        let d = &p.admitted[0];
        let prop = d.proposal.as_ref().unwrap();
        assert_eq!(prop.operation, "unhealthy");
        assert_eq!(prop.machine_type, "IPMI-2.0");
        assert!(prop.reason.contains("unhealthy for 2m"), "{}", prop.reason);
        assert_eq!(d.domain, "3");
        let l = p
            .limits
            .iter()
            .find(|l| l.rule == Rule::SabakanUnavailable)
            .unwrap();
        assert!(!l.holding);
        assert!(
            l.sentence.contains("answered 5s ago: 1 machine matches"),
            "{}",
            l.sentence
        );
    }

    #[test]
    fn a_sabakan_that_cannot_be_read_holds_auto_repair_and_nothing_else() {
        let ready = |status: &str| UnhealthyCondition {
            type_: "Ready".into(),
            status: status.into(),
            timeout: Duration::from_secs(60),
        };
        let now = fixture::t0();
        let c = case()
            .machine("10.0.0.1")
            .condition("Ready", "False", 600)
            .cfg(|c| {
                c.health_checks.push(HealthCheck {
                    name: "ready".into(),
                    selector: Selector::default(),
                    unhealthy_conditions: vec![ready("False")],
                    node_startup_timeout: Duration::from_secs(1800),
                    max_unhealthy: None,
                    unhealthy_range: None,
                    operation: "not-ready".into(),
                })
            })
            .sabakan(
                Some(5),
                vec![from_sabakan("10.0.0.9", MachineState::Unhealthy, now)],
                Some("cannot reach sabakan at http://sabakan.test/graphql: connection refused"),
            );
        let p = c.run();
        // The health check still admits its machine; sabakan's old answer enqueues nothing.
        assert_eq!(p.admitted_addresses(), ["10.0.0.1"]);
        let d = p.held_for(JOURNAL_ADDRESS).unwrap();
        assert_eq!(
            (d.outcome, d.rule),
            (Outcome::Held, Rule::SabakanUnavailable)
        );
        assert_eq!(
            d.sentence,
            "held: auto-repair reads sabakan at http://sabakan.test/graphql, which cannot be \
             read: cannot reach sabakan at http://sabakan.test/graphql: connection refused; \
             nothing is enqueued from an old answer"
        );
        assert!(p.held_for("10.0.0.9").is_none());
        let l = p
            .limits
            .iter()
            .find(|l| l.rule == Rule::SabakanUnavailable)
            .unwrap();
        assert!(l.holding);
    }

    #[test]
    fn an_old_answer_or_none_at_all_holds() {
        let now = fixture::t0();
        let m = || vec![from_sabakan("10.0.0.9", MachineState::Unhealthy, now)];
        let (r, s) = case().sabakan(Some(41), m(), None).held(JOURNAL_ADDRESS);
        assert_eq!(r, Rule::SabakanUnavailable);
        assert!(s.contains("last answered 41s ago (limit 40s)"), "{s}");
        let (_, s) = case().sabakan(None, vec![], None).held(JOURNAL_ADDRESS);
        assert!(s.contains("has not answered yet"), "{s}");
        let p = case().sabakan(Some(40), m(), None).run();
        assert_eq!(p.admitted_addresses(), ["10.0.0.9"], "{:#?}", p.held);
        // Disabled: nothing held, nothing read.
        let p = case()
            .sabakan(None, vec![], None)
            .cfg(|c| c.auto_repair.enabled = false)
            .run();
        assert!(p.held.is_empty() && p.admitted.is_empty());
    }

    #[test]
    fn cke_limiters_apply_to_sabakans_machines() {
        let now = fixture::t0();
        let m = |a: &str| {
            from_sabakan(
                a,
                MachineState::Unreachable,
                now - SignedDuration::from_secs(600),
            )
        };
        // An entry for the machine (finished or not) holds it.
        let c = case()
            .no_kube()
            .sabakan(Some(1), vec![m("10.0.0.8"), m("10.0.0.9")], None)
            .entry("10.0.0.8", protocol::admin::repair::RepairStatus::Succeeded);
        assert_eq!(c.admitted(), ["10.0.0.9"]);
        assert_eq!(c.held("10.0.0.8").0, Rule::QueueHasEntry);
        // All or nothing.
        let c = case()
            .no_kube()
            .cfg(|c| c.maximum_repair_queue_entries = 1)
            .sabakan(Some(1), vec![m("10.0.0.8"), m("10.0.0.9")], None);
        assert!(c.admitted().is_empty());
        assert_eq!(c.held("10.0.0.9").0, Rule::MaximumRepairQueueEntries);
    }

    fn rec(address: &str) -> SabakanMachine {
        SabakanMachine {
            serial: format!("S-{address}"),
            labels: BTreeMap::from([
                ("product".into(), "R640".into()),
                ("zone".into(), "z9".into()),
            ]),
            rack: 7,
            role: "ss".into(),
            address: address.into(),
            bmc_type: "iDRAC-9".into(),
            state: MachineState::Unreachable,
            since: fixture::t0(),
            duration: 1.0,
        }
    }

    #[test]
    fn facts_keep_the_registrys_domain_and_agent_and_drop_answers_to_other_variables() {
        let cfg = SabakanConfig {
            url: URL.into(),
            timeout: Duration::from_secs(2),
            ca_file: None,
        };
        let src = SabakanSource::new(&cfg, Duration::from_secs(10));
        assert_eq!(src.max_age, Duration::from_secs(32));
        let ar = RemediationConfig::default().auto_repair;
        let vars = client::variables(&ar.having, &ar.not_having).unwrap();
        src.latest().read = Some((fixture::t0(), vars, vec![rec("10.0.0.1"), rec("10.0.0.2")]));
        let mut known = fixture::healthy("10.0.0.1", "r1", fixture::t0());
        known.labels.insert("zone".into(), "z1".into());
        let f = src.facts(&ar, &[known.clone()], None);
        let (_, ms) = f.read.unwrap();
        let (a, b) = (&ms[0], &ms[1]);
        // Known: registry's rack, labels first, agent facts and Node; sabakan's the rest.
        assert_eq!((a.rack.as_str(), a.labels["zone"].as_str()), ("r1", "z1"));
        assert_eq!(a.labels["product"], "R640");
        assert_eq!(a.node, known.node);
        assert_eq!(a.last_report_at, known.last_report_at);
        assert_eq!(
            (
                a.machine_type.as_deref(),
                a.state,
                a.serial.as_str(),
                a.role.as_str()
            ),
            (
                Some("iDRAC-9"),
                MachineState::Unreachable,
                "S-10.0.0.1",
                "ss"
            )
        );
        // Only sabakan's: its own rack number as the rack, no agent, no Node.
        assert_eq!(
            (b.rack.as_str(), b.last_report_at, &b.node),
            ("7", None, &None)
        );
        // set-variables changed having: the answer to the old variables is not used.
        let mut other = ar.clone();
        other.having.roles = vec!["cs".into()];
        assert!(src.facts(&other, &[], None).read.is_none());
    }

    #[test]
    fn config_needs_a_url_and_sabakan_shaped_filters() {
        let parse = |t: &str| RemediationConfig::from_toml(t);
        let c = parse(
            "[auto_repair]\nsource = \"sabakan\"\n[auto_repair.sabakan]\nurl = \"http://s:10080/graphql\"\n",
        )
        .unwrap();
        assert_eq!(c.auto_repair.source, Source::Sabakan);
        assert_eq!(c.auto_repair.sabakan.unwrap().timeout, DEFAULT_TIMEOUT);
        assert_eq!(
            RemediationConfig::default().auto_repair.source,
            Source::Inventory
        );
        for (text, want) in [
            (
                "[auto_repair]\nsource = \"sabakan\"\n",
                "auto_repair.sabakan",
            ),
            (
                "[auto_repair]\nsource = \"sabakan\"\nsabakan = { url = \"s:1\" }\n",
                "auto_repair.sabakan.url",
            ),
            (
                "[auto_repair]\nsource = \"sabakan\"\nsabakan = { url = \"https://s/graphql\" }\n",
                "auto_repair.sabakan.ca_file",
            ),
            (
                "[auto_repair]\nsource = \"sabakan\"\nhaving = { racks = [\"r1\"], states = [\"unhealthy\"] }\n\
                 sabakan = { url = \"http://s/graphql\" }\n",
                "auto_repair.having.racks",
            ),
            (
                "[auto_repair]\nhaving = { racks = [\"3\"] }\n",
                "auto_repair.having.states",
            ),
            ("[auto_repair]\nsource = \"etcd\"\n", "etcd"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[tokio::test]
    async fn set_variables_refuses_what_sabakan_could_not_be_asked() {
        use protocol::admin::AdminResponse;
        use protocol::admin::remediation::RemediationRequest as R;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("c.db")).unwrap();
        let clock = Arc::new(crate::testing::FakeClock::new(fixture::t0()));
        let cfg = case().sabakan(None, vec![], None).cfg;
        let rem = crate::remediation::Remediation::open(store, clock, cfg, false)
            .await
            .unwrap();
        let set = |json: &str| R::SetVariables { json: json.into() };
        let r = rem
            .handle_admin(set(
                r#"{"having": {"racks": ["r1"], "states": ["unhealthy"]}}"#,
            ))
            .await;
        let AdminResponse::Error(e) = r else {
            panic!("accepted: {r:?}")
        };
        assert!(
            e.to_string()
                .contains("auto-repair reads sabakan: having.racks: \"r1\""),
            "{e}"
        );
        // Not an object, or a having with no state: it would match every machine.
        for (json, says) in [
            ("[]", "expected an object"),
            ("{}", "having.states must name at least one state"),
            (r#"{"having": {"racks": ["3"]}}"#, "having.states"),
        ] {
            let r = rem.handle_admin(set(json)).await;
            let AdminResponse::Error(e) = r else {
                panic!("{json} accepted: {r:?}")
            };
            assert!(e.to_string().contains(says), "{json}: {e}");
        }
        let r = rem
            .handle_admin(set(
                r#"{"having": {"racks": ["3"], "states": ["unhealthy"]}}"#,
            ))
            .await;
        assert!(!matches!(r, AdminResponse::Error(_)), "{r:?}");
    }
}
