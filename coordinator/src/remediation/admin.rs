//! The admin API's remediation requests: operator switches (written to the store first, then
//! applied, then the loop is woken so the next pass sees them at once), `remediation status`
//! (the switches and the last pass's limits) and `events` (the journal).

use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::admin::AdminResponse;
use protocol::admin::remediation::{
    Constraints, RemediationRequest, RemediationResponse, RemediationStatus,
};
use protocol::messages::{Refusal, RefusalCode};

use super::runner::{Remediation, Shared};
use super::store::RemediationStore;
use super::switches::{Variables, key};
use crate::clock::to_unix_ms;

/// How long a switch's answer waits for a pass that saw the change (passes take milliseconds;
/// a slow one leaves the answer with the table of the pass before, said in the log).
const PASS_WAIT: Duration = Duration::from_secs(2);

fn ms(t: jiff::Timestamp) -> u64 {
    u64::try_from(to_unix_ms(t)).unwrap_or(0)
}

/// The switches part of a status (limits and decisions come from the last pass).
pub(super) fn switch_status(shared: &Shared) -> RemediationStatus {
    let s = shared.switches();
    let cfg = s.effective(&shared.base);
    RemediationStatus {
        observe: cfg.observe,
        auto_repair_enabled: cfg.auto_repair.enabled,
        paused: s.paused.as_ref().map(|(r, t)| (r.clone(), ms(*t))),
        outage_confirmed_unix_ms: s.outage_confirmed_at.map(ms),
        kubernetes: shared.kubernetes,
        ..RemediationStatus::default()
    }
}

fn bad(reason: impl Into<String>) -> AdminResponse {
    AdminResponse::Error(Refusal::new(RefusalCode::BadRequest, reason))
}

impl Remediation {
    /// Answers one remediation request.
    pub async fn handle_admin(&self, req: RemediationRequest) -> AdminResponse {
        let sh = &self.shared;
        let now = sh.clock.now();
        let now_ms = to_unix_ms(now);
        use RemediationRequest as R;
        // Each switch: (key, value to store) or a direct answer.
        let write: (&'static str, Option<String>) = match req {
            R::Status => return self.status(),
            R::IsAutoRepairEnabled => {
                let on = sh.switches().effective(&sh.base).auto_repair.enabled;
                return ok(RemediationResponse::AutoRepairEnabled(on));
            }
            R::GetVariables => {
                let v = sh.switches().variables_json(&sh.base);
                return ok(RemediationResponse::Variables(v));
            }
            R::Constraints => return ok(RemediationResponse::Constraints(self.constraints())),
            R::Events(q) => {
                return match sh.store.events(q).await {
                    Ok(lines) => ok(RemediationResponse::Events(lines)),
                    Err(e) => {
                        AdminResponse::Error(Refusal::new(RefusalCode::Internal, e.to_string()))
                    }
                };
            }
            R::Pause { reason } if reason.trim().is_empty() => {
                return bad("a pause needs a reason (--reason TEXT), shown in every held decision");
            }
            R::Pause { reason } if reason.chars().any(char::is_control) => {
                return bad(
                    "a pause reason is one line of text: no newlines, tabs or escape characters",
                );
            }
            R::Pause { reason } if reason.chars().count() > 1000 => {
                return bad("a pause reason is at most 1000 characters");
            }
            R::Pause { reason } => (key::PAUSED, Some(reason)),
            R::Resume => (key::PAUSED, None),
            R::Observe(on) => (key::OBSERVE, Some(if on { "on" } else { "off" }.into())),
            R::SetAutoRepair(on) => (key::AUTO_REPAIR, Some(if on { "on" } else { "off" }.into())),
            R::ConfirmOutage => (key::OUTAGE_CONFIRMED, Some("confirmed".into())),
            R::SetVariables { json } => match Variables::parse(&json) {
                // sabakan could not be asked with them (a rack name, a state of our own).
                Ok(v) if sh.base.auto_repair.source == super::sabakan::Source::Sabakan => {
                    match super::sabakan::client::variables(&v.having, &v.not_having) {
                        Ok(_) => (key::VARIABLES, Some(json)),
                        Err(e) => return bad(format!("auto-repair reads sabakan: {e}")),
                    }
                }
                Ok(_) => (key::VARIABLES, Some(json)),
                Err(e) => return bad(e),
            },
            R::SetConstraint { name, value } => match name.as_str() {
                key::MAX_ENTRIES if value == 0 => {
                    return bad("maximum-repair-queue-entries 0 would never enqueue anything");
                }
                key::MAX_ENTRIES if u32::try_from(value).is_err() => {
                    return bad("maximum-repair-queue-entries is too large");
                }
                key::MAX_ENTRIES => (key::MAX_ENTRIES, Some(value.to_string())),
                key::WAIT_REBOOTING => match super::config::check_wait_rebooting(value) {
                    Ok(()) => (key::WAIT_REBOOTING, Some(value.to_string())),
                    Err(e) => return bad(format!("{}: {e}", key::WAIT_REBOOTING)),
                },
                other => {
                    return bad(format!(
                        "unknown constraint {other:?}; known: {}, {}",
                        key::MAX_ENTRIES,
                        key::WAIT_REBOOTING
                    ));
                }
            },
            R::ClearMachine { address } => {
                let a = address.clone();
                let was = match sh.store.clear_machine(a, now_ms).await {
                    Ok(Some(was)) => was,
                    Ok(None) => {
                        return bad(crate::fleet::FleetError::UnknownMachine(address).to_string());
                    }
                    Err(e) => {
                        return AdminResponse::Error(Refusal::new(
                            RefusalCode::Internal,
                            e.to_string(),
                        ));
                    }
                };
                sh.switches().cleared.insert(address.clone(), now);
                tracing::info!(machine = %address, was_needs_human = was, "machine cleared of needs-human");
                sh.wake.notify_one();
                return ok(RemediationResponse::Cleared {
                    address,
                    at_unix_ms: ms(now),
                    was_needs_human: was,
                });
            }
        };
        let (k, v) = write;
        let stored = v.clone();
        if let Err(e) = sh.store.set_switch(k.to_string(), stored, now_ms).await {
            return AdminResponse::Error(Refusal::new(RefusalCode::Internal, e.to_string()));
        }
        {
            let mut s = sh.switches();
            let mut rows = std::collections::BTreeMap::new();
            if let Some(v) = &v {
                rows.insert(k.to_string(), (v.clone(), now_ms));
            }
            let parsed = super::switches::Switches::from_rows(&rows, Default::default());
            match k {
                key::PAUSED => s.paused = parsed.paused,
                key::OBSERVE => s.observe = parsed.observe,
                key::AUTO_REPAIR => s.auto_repair = parsed.auto_repair,
                key::VARIABLES => s.variables = parsed.variables,
                key::MAX_ENTRIES => s.max_entries = parsed.max_entries,
                key::WAIT_REBOOTING => s.wait_rebooting = parsed.wait_rebooting,
                _ => s.outage_confirmed_at = parsed.outage_confirmed_at,
            }
        }
        tracing::info!(switch = k, value = ?v, "remediation switch set");
        let changed = sh.switched.fetch_add(1, Ordering::SeqCst) + 1;
        sh.wake.notify_one();
        match k {
            key::AUTO_REPAIR => self.handle_bool_answer(),
            key::VARIABLES => ok(RemediationResponse::Variables(
                sh.switches().variables_json(&sh.base),
            )),
            key::MAX_ENTRIES | key::WAIT_REBOOTING => {
                ok(RemediationResponse::Constraints(self.constraints()))
            }
            _ => {
                // The answer's limits come from the pass that saw the change: a pause
                // answered with the table of the pass before would read "not paused".
                self.pass_seen(changed).await;
                self.status()
            }
        }
    }

    /// Waits (up to [`PASS_WAIT`]) until a pass that saw switch change number `changed` ends;
    /// at once when the loop does not run.
    async fn pass_seen(&self, changed: u64) {
        let mut passed = self.shared.passed.subscribe();
        let done = passed.wait_for(|p| p.is_none_or(|seen| seen >= changed));
        if tokio::time::timeout(PASS_WAIT, done).await.is_err() {
            tracing::warn!(
                "no remediation pass within {PASS_WAIT:?} of a switch change; its status shows the pass before"
            );
        }
    }

    fn handle_bool_answer(&self) -> AdminResponse {
        let on = self
            .shared
            .switches()
            .effective(&self.shared.base)
            .auto_repair
            .enabled;
        ok(RemediationResponse::AutoRepairEnabled(on))
    }

    fn constraints(&self) -> Constraints {
        let c = self.shared.switches().effective(&self.shared.base);
        Constraints {
            maximum_repair_queue_entries: u64::from(c.maximum_repair_queue_entries),
            wait_seconds_to_repair_rebooting: c.wait_seconds_to_repair_rebooting,
        }
    }

    fn status(&self) -> AdminResponse {
        let last = self.shared.last().clone();
        let mut s = switch_status(&self.shared);
        s.last_pass_unix_ms = last.last_pass_unix_ms;
        s.limits = last.limits;
        s.decisions = last.decisions;
        s.decisions_omitted = last.decisions_omitted;
        ok(RemediationResponse::Status(Box::new(s)))
    }
}

fn ok(r: RemediationResponse) -> AdminResponse {
    AdminResponse::Remediation(r)
}
