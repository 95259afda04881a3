//! [`RedfishPowerControl`]: a small Redfish client on reqwest (rustls with the ring provider,
//! configured here and handed to reqwest preconfigured).
//!
//! It finds the ComputerSystem (a configured id, or the only member of `/redfish/v1/Systems`),
//! reads `PowerState`, and posts `ComputerSystem.Reset` with a `ResetType` chosen from the
//! system's `ResetType@Redfish.AllowableValues`: a power cycle uses `PowerCycle`, else
//! `ForceRestart`, else off-then-on. It accepts 200/202/204, follows a returned Task until it
//! ends, and authenticates with Basic auth or a SessionService login (`X-Auth-Token`) when the
//! service offers one. It does not decide what an action means (see [`crate::actions`]).
//!
//! The HTTP side (the client, one request with its credentials, the SessionService login) is
//! in `redfish/session.rs`; this file holds what is asked of the system: its discovery, its
//! power state, resets and the Tasks they return.

use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tracing::{debug, warn};

use crate::power::{BmcError, ChassisOp, PowerControl, PowerReading, PowerState};
pub use crate::redfish_tls::{Trust, rustls_config};

mod session;
use session::error_message;
#[cfg(test)]
mod fake_service;

/// How often a returned Task, or the power state during an off-then-on cycle, is polled.
///
/// 1 s: BMC tasks for power actions take seconds; polling faster only loads the BMC's web server.
pub const TASK_POLL: Duration = Duration::from_secs(1);

/// Longest an off-then-on cycle waits for the power to read off before powering on.
///
/// 60 s, like a fence: past that the BMC is not applying the off and powering on would be wrong.
pub const CYCLE_OFF_WAIT: Duration = Duration::from_secs(60);

/// How to authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// HTTP Basic on every request.
    Basic,
    /// SessionService login; fail if the service has none.
    Session,
    /// Session when the service offers one, else Basic.
    Auto,
}

/// Where and how to reach one Redfish BMC.
#[derive(Debug, Clone)]
pub struct RedfishTarget {
    /// Name for messages.
    pub name: String,
    /// `host:port`.
    pub authority: String,
    /// Certificate trust (and scheme).
    pub trust: Trust,
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// System id, or `discover`.
    pub system: String,
    /// Authentication mode.
    pub auth: AuthMode,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

#[derive(Debug, Default)]
struct Cached {
    /// `@odata.id` of the system.
    system: Option<String>,
    /// Session token and session URI, once logged in.
    token: Option<(String, Option<String>)>,
    /// Whether the service root was checked for a SessionService.
    auth_decided: bool,
}

/// Redfish power control for one BMC.
#[derive(Debug)]
pub struct RedfishPowerControl {
    t: RedfishTarget,
    base: String,
    client: reqwest::Client,
    cached: Mutex<Cached>,
}

fn json_str<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

/// The reset types a system offers; `None` when it does not say (then any standard one is
/// tried).
pub fn allowable_reset_types(system: &Value) -> Option<Vec<String>> {
    let action = system.get("Actions")?.get("#ComputerSystem.Reset")?;
    let vals = action
        .get("ResetType@Redfish.AllowableValues")?
        .as_array()?;
    Some(
        vals.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
    )
}

/// How a chassis operation is carried out on a Redfish system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetPlan {
    /// One `ComputerSystem.Reset` with this `ResetType`.
    One(String),
    /// `ForceOff`, wait until off, then `On` (a cycle on a system without `PowerCycle` or
    /// `ForceRestart`).
    OffThenOn {
        /// The off reset type.
        off: String,
        /// The on reset type.
        on: String,
    },
}

/// Chooses the reset type(s) for `op` among `allowed` (`None` = the system does not say).
pub fn plan_reset(op: ChassisOp, allowed: Option<&[String]>) -> Result<ResetPlan, String> {
    let has = |t: &str| allowed.is_none_or(|a| a.iter().any(|x| x == t));
    let first = |cands: &[&str]| cands.iter().find(|c| has(c)).map(|c| c.to_string());
    let offered = || allowed.map(|a| a.join(", ")).unwrap_or_default();
    let need = |cands: &[&str]| {
        first(cands).map(ResetPlan::One).ok_or_else(|| {
            format!(
                "none of {} is offered (offered: {})",
                cands.join(", "),
                offered()
            )
        })
    };
    match op {
        ChassisOp::On => need(&["On", "ForceOn"]),
        ChassisOp::Off => need(&["ForceOff"]),
        ChassisOp::SoftOff => need(&["GracefulShutdown"]),
        ChassisOp::Reset => need(&["ForceRestart", "PowerCycle"]),
        ChassisOp::Cycle => {
            if let Some(t) = first(&["PowerCycle", "ForceRestart"]) {
                return Ok(ResetPlan::One(t));
            }
            match (first(&["ForceOff"]), first(&["On", "ForceOn"])) {
                (Some(off), Some(on)) => Ok(ResetPlan::OffThenOn { off, on }),
                _ => Err(format!(
                    "no PowerCycle, ForceRestart or ForceOff+On (offered: {})",
                    offered()
                )),
            }
        }
    }
}

/// Maps a Redfish `PowerState` to ours: `PoweringOff` is still on; `PoweringOn` is not yet
/// known to be on.
pub fn parse_power_state(s: &str) -> PowerState {
    match s {
        "On" | "PoweringOff" | "Paused" => PowerState::On,
        "Off" => PowerState::Off,
        _ => PowerState::Unknown,
    }
}

/// Longest part of a BMC's `PowerState` word quoted in a message: a BMC answering garbage
/// must not fill a table cell or a log line with it.
const WORD_SHOWN: usize = 40;

/// A Redfish `PowerState` as [`parse_power_state`] counts it, with the BMC's word and what it
/// means when it is not plainly `On` or `Off`.
pub fn read_power_state(s: &str) -> PowerReading {
    let meaning = match s {
        "On" | "Off" => None,
        "PoweringOn" => Some("a power-on is under way; read again in a few seconds"),
        "PoweringOff" => {
            Some("a power-off is under way; counted as on (not fenced) until it reads Off")
        }
        "Paused" => Some("the system is on but halted"),
        _ => Some("not a Redfish power state this gateway knows"),
    };
    let word: String = s.chars().take(WORD_SHOWN).collect();
    PowerReading {
        state: parse_power_state(s),
        note: meaning.map(|m| format!("the BMC says PowerState {word:?}: {m}")),
    }
}

impl RedfishPowerControl {
    async fn prepare(&self, cached: &mut Cached) -> Result<String, BmcError> {
        if !cached.auth_decided {
            self.login(cached).await?;
            cached.auth_decided = true;
        }
        if let Some(s) = &cached.system {
            return Ok(s.clone());
        }
        let path = if self.t.system == "discover" {
            let coll = self.get_json(cached, "/redfish/v1/Systems").await?;
            let members: Vec<String> = coll
                .get("Members")
                .and_then(|m| m.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|m| json_str(m, &["@odata.id"]).map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            match members.as_slice() {
                [one] => one.clone(),
                [] => {
                    return Err(BmcError::Protocol {
                        bmc: self.t.name.clone(),
                        what: "system discovery".into(),
                        detail: "/redfish/v1/Systems has no members".into(),
                    });
                }
                many => {
                    return Err(BmcError::Unsupported {
                        bmc: self.t.name.clone(),
                        what: "system discovery".into(),
                        detail: format!(
                            "{} systems ({}); set redfish.system to one id",
                            many.len(),
                            many.join(", ")
                        ),
                    });
                }
            }
        } else {
            format!("/redfish/v1/Systems/{}", self.t.system)
        };
        cached.system = Some(path.clone());
        Ok(path)
    }

    async fn read_system(&self) -> Result<(String, Value), BmcError> {
        let mut cached = self.cached.lock().await;
        let path = self.prepare(&mut cached).await?;
        let v = self.get_json(&mut cached, &path).await?;
        Ok((path, v))
    }

    async fn reset(
        &self,
        system_path: &str,
        system: &Value,
        reset_type: &str,
    ) -> Result<String, BmcError> {
        let target = system
            .get("Actions")
            .and_then(|a| a.get("#ComputerSystem.Reset"))
            .and_then(|r| json_str(r, &["target"]))
            .map(str::to_string)
            .unwrap_or_else(|| format!("{system_path}/Actions/ComputerSystem.Reset"));
        let what = format!("ComputerSystem.Reset {reset_type}");
        let mut cached = self.cached.lock().await;
        let (status, location, text) = self
            .send(
                &mut cached,
                Method::POST,
                &target,
                Some(&json!({ "ResetType": reset_type })),
            )
            .await?;
        match status.as_u16() {
            200 | 204 => Ok(format!("{what}: HTTP {status}")),
            202 => {
                let task = location.or_else(|| {
                    serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| json_str(&v, &["@odata.id"]).map(str::to_string))
                });
                match task {
                    None => Ok(format!("{what}: HTTP 202 (no task to follow)")),
                    Some(task) => {
                        drop(cached);
                        self.follow_task(&what, &task).await
                    }
                }
            }
            409 | 503 => Err(BmcError::Busy {
                bmc: self.t.name.clone(),
                what,
                detail: format!("HTTP {status}: {}", error_message(&text)),
            }),
            _ => Err(BmcError::Refused {
                bmc: self.t.name.clone(),
                what,
                detail: format!("HTTP {status}: {}", error_message(&text)),
            }),
        }
    }

    async fn follow_task(&self, what: &str, task: &str) -> Result<String, BmcError> {
        loop {
            let v = {
                let mut cached = self.cached.lock().await;
                match self.get_json(&mut cached, task).await {
                    // A task monitor is deleted once its task is done (Redfish spec: a GET
                    // then answers 404); a fast BMC deletes it before the first poll. The
                    // reset was accepted: what it did is read from the power state after.
                    Err(BmcError::Refused { detail, .. }) if detail.starts_with("HTTP 404") => {
                        return Ok(format!(
                            "{what}: accepted; task {task} already gone (HTTP 404), taken as finished"
                        ));
                    }
                    r => r?,
                }
            };
            let state = json_str(&v, &["TaskState"]).unwrap_or("").to_string();
            match state.as_str() {
                "Completed" => {
                    let ts = json_str(&v, &["TaskStatus"]).unwrap_or("OK");
                    if ts == "OK" || ts.is_empty() {
                        return Ok(format!("{what}: task {task} completed"));
                    }
                    return Err(BmcError::Refused {
                        bmc: self.t.name.clone(),
                        what: what.to_string(),
                        detail: format!("task {task} completed with status {ts}"),
                    });
                }
                "Exception" | "Killed" | "Cancelled" | "Interrupted" => {
                    let msg = v
                        .get("Messages")
                        .and_then(|m| m.as_array())
                        .and_then(|a| a.first())
                        .and_then(|m| json_str(m, &["Message"]))
                        .unwrap_or("");
                    return Err(BmcError::Refused {
                        bmc: self.t.name.clone(),
                        what: what.to_string(),
                        detail: format!("task {task} ended {state}: {msg}"),
                    });
                }
                _ => {
                    debug!(bmc = %self.t.name, task, state, "task still running");
                    tokio::time::sleep(TASK_POLL).await;
                }
            }
        }
    }

    async fn state_now(&self) -> Result<PowerReading, BmcError> {
        let (path, v) = self.read_system().await?;
        // A system that does not say its power state (absent or null) can never be confirmed
        // off: an error naming it, rather than a silent "unknown" that only fences discover.
        match v.get("PowerState") {
            Some(Value::String(s)) => Ok(read_power_state(s)),
            Some(other) if !other.is_null() => Err(BmcError::Protocol {
                bmc: self.t.name.clone(),
                what: format!("GET {path}"),
                detail: format!(
                    "the ComputerSystem's PowerState is {}, not a string like \"On\"",
                    session::printable(&other.to_string(), WORD_SHOWN)
                ),
            }),
            _ => Err(BmcError::Protocol {
                bmc: self.t.name.clone(),
                what: format!("GET {path}"),
                detail: "the ComputerSystem has no PowerState (absent or null), so power off \
                         can never be confirmed; is redfish.system the right system?"
                    .into(),
            }),
        }
    }
}

impl PowerControl for RedfishPowerControl {
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
        Box::pin(async move { self.state_now().await.map(|r| r.state) })
    }

    fn power_reading(&self) -> BoxFuture<'_, Result<PowerReading, BmcError>> {
        Box::pin(self.state_now())
    }

    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
        Box::pin(async move {
            let (path, system) = self.read_system().await?;
            let allowed = allowable_reset_types(&system);
            let plan =
                plan_reset(op, allowed.as_deref()).map_err(|detail| BmcError::Unsupported {
                    bmc: self.t.name.clone(),
                    what: format!("power {}", op.as_str()),
                    detail,
                })?;
            match plan {
                ResetPlan::One(t) => {
                    let said = self.reset(&path, &system, &t).await?;
                    if op == ChassisOp::Cycle && t != "PowerCycle" {
                        Ok(format!("PowerCycle not offered, used {t}: {said}"))
                    } else {
                        Ok(said)
                    }
                }
                ResetPlan::OffThenOn { off, on } => {
                    let first = self.reset(&path, &system, &off).await?;
                    let started = tokio::time::Instant::now();
                    loop {
                        if self.state_now().await?.state == PowerState::Off {
                            break;
                        }
                        if started.elapsed() > CYCLE_OFF_WAIT {
                            return Err(BmcError::Timeout {
                                bmc: self.t.name.clone(),
                                what: format!("power off before power on ({first})"),
                                waited_ms: CYCLE_OFF_WAIT.as_millis() as u64,
                            });
                        }
                        tokio::time::sleep(TASK_POLL).await;
                    }
                    let second = self.reset(&path, &system, &on).await?;
                    Ok(format!(
                        "PowerCycle and ForceRestart not offered: {first}; power read off; {second}"
                    ))
                }
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut cached = self.cached.lock().await;
            if let Some((_, Some(loc))) = cached.token.clone() {
                match self.send(&mut cached, Method::DELETE, &loc, None).await {
                    Ok((s, _, _)) => {
                        debug!(bmc = %self.t.name, status = %s, "Redfish session closed")
                    }
                    Err(e) => {
                        warn!(bmc = %self.t.name, error = %e, "closing the Redfish session failed")
                    }
                }
            }
            cached.token = None;
            cached.auth_decided = false;
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn plans_follow_allowable_values() {
        let all = s(&[
            "On",
            "ForceOff",
            "GracefulShutdown",
            "ForceRestart",
            "PowerCycle",
        ]);
        assert_eq!(
            plan_reset(ChassisOp::Cycle, Some(&all)),
            Ok(ResetPlan::One("PowerCycle".into()))
        );
        let sushy = s(&[
            "On",
            "ForceOff",
            "GracefulShutdown",
            "GracefulRestart",
            "ForceRestart",
            "Nmi",
            "ForceOn",
        ]);
        assert_eq!(
            plan_reset(ChassisOp::Cycle, Some(&sushy)),
            Ok(ResetPlan::One("ForceRestart".into()))
        );
        assert_eq!(
            plan_reset(ChassisOp::Cycle, Some(&s(&["ForceOff", "On"]))),
            Ok(ResetPlan::OffThenOn {
                off: "ForceOff".into(),
                on: "On".into()
            })
        );
        assert_eq!(
            plan_reset(ChassisOp::On, Some(&s(&["ForceOn"]))),
            Ok(ResetPlan::One("ForceOn".into()))
        );
        let e = plan_reset(ChassisOp::Off, Some(&s(&["On", "GracefulShutdown"]))).unwrap_err();
        assert!(
            e.contains("ForceOff") && e.contains("offered: On, GracefulShutdown"),
            "{e}"
        );
        // A system that lists nothing gets the standard types.
        assert_eq!(
            plan_reset(ChassisOp::Cycle, None),
            Ok(ResetPlan::One("PowerCycle".into()))
        );
        assert_eq!(parse_power_state("PoweringOff"), PowerState::On);
        assert_eq!(parse_power_state("PoweringOn"), PowerState::Unknown);
    }

    use std::sync::Arc;

    use fake_service::{Fake, client, serve};

    #[tokio::test]
    async fn session_login_task_following_and_off_then_on_cycle() {
        let fake = Arc::new(Fake::default());
        *fake.power.lock().unwrap() = "On".into();
        let addr = serve(fake.clone()).await;
        let c = client(addr, "pw");
        let limit = Duration::from_secs(20);
        assert_eq!(
            tokio::time::timeout(limit, c.power_state()).await.unwrap(),
            Ok(PowerState::On)
        );
        let said = tokio::time::timeout(limit, c.chassis(ChassisOp::Cycle))
            .await
            .unwrap()
            .unwrap();
        assert!(
            said.contains("PowerCycle and ForceRestart not offered"),
            "{said}"
        );
        assert!(
            said.contains("task /redfish/v1/TaskService/Tasks/7 completed"),
            "{said}"
        );
        assert_eq!(*fake.power.lock().unwrap(), "On");
        tokio::time::timeout(limit, c.close()).await.unwrap();
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [
                "login", "ForceOff", "task1", "task2", "On", "task1", "task2", "logout 1"
            ]
        );
    }

    /// A ComputerSystem with `"PowerState": null` read as "unknown" with no word of why:
    /// `check` passed it (exit 0) and every fence timed out "still reads unknown".
    #[tokio::test]
    async fn a_system_without_a_power_state_is_an_error_naming_it() {
        let fake = Arc::new(Fake::default());
        let addr = serve(fake).await;
        let e = tokio::time::timeout(Duration::from_secs(20), client(addr, "pw").power_state())
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, BmcError::Protocol { .. }), "{e}");
        assert!(
            e.to_string().contains("/redfish/v1/Systems/s1")
                && e.to_string().contains("no PowerState"),
            "{e}"
        );
    }

    /// A BMC that applied the off and deleted its task monitor before the first poll: the
    /// 404 made the fence fail as "refused" with the machine already off.
    /// `check` showed a BMC in the middle of a power change as "unknown" with no word of why.
    /// The BMC's word is kept; a fence takes only `Off` as off, never `PoweringOff`.
    #[tokio::test]
    async fn transient_power_states_keep_the_bmc_word_and_powering_off_is_not_off() {
        use crate::actions::{self, ActionLimits, SystemClock};
        use protocol::gateway::{PowerAction, PowerOutcome};
        let fake = Arc::new(Fake::default());
        *fake.power.lock().unwrap() = "On".into();
        *fake.transient.lock().unwrap() = vec!["PoweringOff".into(); 2];
        let c = client(serve(fake.clone()).await, "pw");
        let limits = ActionLimits {
            timeout: Duration::from_secs(20),
            poll: Duration::from_millis(10),
        };
        let o = actions::run(&c, PowerAction::Fence, limits, &SystemClock).await;
        let PowerOutcome::Done {
            confirmed_off_unix_ms: Some(_),
            detail,
            ..
        } = o
        else {
            panic!("{o:?}")
        };
        assert!(detail.contains("read off after 3 reads"), "{detail}");

        for (word, state) in [
            ("PoweringOn", PowerState::Unknown),
            ("PoweringOff", PowerState::On),
            ("Paused", PowerState::On),
            ("Hibernating\u{1b}[2J", PowerState::Unknown),
        ] {
            *fake.power.lock().unwrap() = word.into();
            let r = c.power_reading().await.unwrap();
            let note = r.note.unwrap_or_default();
            assert_eq!(r.state, state, "{word}");
            assert!(note.contains(&format!("{word:?}")), "{note}");
        }
        let o = actions::run(&c, PowerAction::Status, limits, &SystemClock).await;
        assert!(
            matches!(&o, PowerOutcome::Done { detail, .. } if detail.contains("not a Redfish power state this gateway knows")),
            "{o:?}"
        );
    }

    #[tokio::test]
    async fn a_task_gone_before_its_first_poll_is_taken_as_finished() {
        let fake = Arc::new(Fake::default());
        *fake.power.lock().unwrap() = "On".into();
        *fake.task_gone.lock().unwrap() = true;
        let addr = serve(fake.clone()).await;
        let c = client(addr, "pw");
        let said = tokio::time::timeout(Duration::from_secs(20), c.chassis(ChassisOp::Off))
            .await
            .unwrap()
            .unwrap();
        assert!(said.contains("already gone (HTTP 404)"), "{said}");
        assert_eq!(c.power_state().await, Ok(PowerState::Off));
    }
}
