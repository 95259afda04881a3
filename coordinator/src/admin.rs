//! The admin API's request handlers: one [`AdminRequest`] in, one [`AdminResponse`] out.
//!
//! Authorisation (admin certificate only) happens before a request gets here, in
//! [`crate::agent_server`]; this module only carries out requests. Each area answers its
//! own part of the envelope: machines here, the repair queue in `crate::repair`.

use std::sync::Arc;

use protocol::Identity;
use protocol::admin::machines::{MachinesRequest, MachinesResponse};
use protocol::admin::{AdminRequest, AdminResponse};
use protocol::messages::{Refusal, RefusalCode};

use crate::fleet::{Fleet, FleetError};
use crate::inventory::{MachineRecord, RecordSource};

/// The machine a listing is filtered by (after [`Admin::resolve_names`]); not for the polls
/// of `events --follow`, which are empty whenever nothing new happened.
fn listing_filter(req: &AdminRequest) -> Option<&str> {
    use protocol::admin::diagnostics::DiagnosticsRequest as D;
    use protocol::admin::fence::FenceRequest as F;
    use protocol::admin::remediation::RemediationRequest as R;
    match req {
        AdminRequest::Remediation(R::Events(q)) if q.after_seq.is_none() => q.machine.as_deref(),
        AdminRequest::Fence(F::ListFor { machine, .. }) => Some(machine),
        AdminRequest::Diagnostics(D::List { address }) => Some(address),
        _ => None,
    }
}

fn is_empty_list(answer: &AdminResponse) -> bool {
    use protocol::admin::diagnostics::DiagnosticsResponse as D;
    use protocol::admin::fence::FenceResponse as F;
    use protocol::admin::remediation::RemediationResponse as R;
    match answer {
        AdminResponse::Remediation(R::Events(l)) => l.is_empty(),
        AdminResponse::Fence(F::List(l)) => l.is_empty(),
        AdminResponse::Diagnostics(D::List(l)) => l.is_empty(),
        _ => false,
    }
}

/// Everything admin requests act on. Areas add their handles here.
#[derive(Debug, Clone)]
pub struct Admin {
    /// Inventory and health.
    pub fleet: Arc<Fleet>,
    /// The repair queue, when a repair configuration is set.
    pub repair: Option<crate::repair::RepairQueue>,
    /// The store, for diagnostics kept with repair entries.
    pub store: crate::store::Store,
    /// Automatic remediation, when `[remediation]` is set.
    pub remediation: Option<crate::remediation::Remediation>,
    /// Crash-dump notices, for `machines show`.
    pub kdump: Option<Arc<crate::kdump::Kdumps>>,
    /// The connected agents, whose session ends when their machine is deleted.
    pub links: Arc<crate::agent_link::AgentLinks>,
    /// This coordinator's name and role, for `coordinatorctl status`.
    pub role: (String, Arc<crate::ha::RoleHandle>),
}

/// `d` without the plugin, gpu and memory results in its last report: every released
/// coordinatorctl decodes the answer, and one from before those kinds would refuse it as
/// malformed. Their names stay in `failing_since`, which is text.
fn readable_by_every_ctl(
    mut d: protocol::admin::machines::MachineDetail,
) -> protocol::admin::machines::MachineDetail {
    d.last_report = d.last_report.map(|r| r.without_newer_kinds());
    d
}

fn error(code: RefusalCode, reason: impl Into<String>) -> AdminResponse {
    AdminResponse::Error(Refusal::new(code, reason))
}

fn fleet_error(e: FleetError) -> AdminResponse {
    let code = match e {
        FleetError::Store(_) => RefusalCode::Internal,
        _ => RefusalCode::BadRequest,
    };
    error(code, e.to_string())
}

impl Admin {
    /// Answers one request from `who` (an admin identity).
    pub async fn handle(&self, who: &Identity, mut req: AdminRequest) -> AdminResponse {
        self.resolve_names(&mut req);
        let filter = listing_filter(&req).map(str::to_string);
        let answer = self.answer(who, req).await;
        let answer = self.checked(filter, answer);
        match self.store.health().failing() {
            // Said with every answer while it lasts: a table of states that could not be
            // stored would otherwise read as the fleet now.
            Some(reason) => AdminResponse::StoreFailing {
                reason,
                answer: Box::new(answer),
            },
            None => answer,
        }
    }

    /// `answer` to a request listing by `filter`, or the refusal of a name nobody has.
    fn checked(&self, filter: Option<String>, answer: AdminResponse) -> AdminResponse {
        // A list filtered by a name nobody has is a typo more often than a quiet machine:
        // said, rather than an empty table. A machine deleted from the inventory still
        // lists what was recorded under its address.
        match filter {
            Some(name) if is_empty_list(&answer) && self.fleet.machine(&name).is_none() => error(
                RefusalCode::BadRequest,
                format!(
                    "{}; nothing is recorded under that name either",
                    FleetError::UnknownMachine(name)
                ),
            ),
            _ => answer,
        }
    }

    async fn answer(&self, who: &Identity, req: AdminRequest) -> AdminResponse {
        match req {
            AdminRequest::Machines(m) => self.machines(who, m).await,
            AdminRequest::RepairQueue(r) => match &self.repair {
                Some(q) => match self.check_repair_request(r) {
                    Ok(r) => {
                        q.handle_admin(r, crate::repair::Requester::admin(&who.name))
                            .await
                    }
                    Err(refusal) => AdminResponse::Error(refusal),
                },
                None => error(
                    RefusalCode::BadRequest,
                    "the repair queue is not enabled in this coordinator: set [repair] config",
                ),
            },
            AdminRequest::Diagnostics(d) => self.diagnostics(d).await,
            AdminRequest::Fence(f) => crate::fence::admin::handle(&self.store, f).await,
            AdminRequest::Status => AdminResponse::Status(self.status()),
            AdminRequest::Remediation(r) => match &self.remediation {
                Some(rem) => rem.handle_admin(r).await,
                None => error(
                    RefusalCode::BadRequest,
                    "automatic remediation is not enabled in this coordinator: add a \
                     [remediation] section to its config",
                ),
            },
        }
    }

    fn status(&self) -> protocol::admin::CoordinatorStatus {
        let (name, role) = &self.role;
        let now = role.current();
        protocol::admin::CoordinatorStatus {
            name: name.clone(),
            role: now.name().to_string(),
            epoch: now.epoch().and_then(|e| u64::try_from(e).ok()).unwrap_or(0),
            since_unix_ms: now.since().map(|t| t.as_millisecond()),
            store: self.store.backend().as_str().to_string(),
            elected: role.is_elected(),
        }
    }

    /// Machine arguments may be an address or a hostname: turned into the address here, so
    /// every handler below sees addresses. Repair-queue entries keep CKE's address (an entry
    /// may name a machine no record holds, with `--force`), and fence flows are listed by
    /// the address they were started for.
    fn resolve_names(&self, req: &mut AdminRequest) {
        use protocol::admin::diagnostics::DiagnosticsRequest as D;
        use protocol::admin::remediation::RemediationRequest as R;
        let name = match req {
            AdminRequest::Machines(
                MachinesRequest::Show { address }
                | MachinesRequest::ShowWithInterval { address }
                | MachinesRequest::ShowWithChecks { address }
                | MachinesRequest::Delete { address, .. }
                | MachinesRequest::SetState { address, .. },
            )
            | AdminRequest::Diagnostics(D::List { address } | D::Get { address, .. })
            | AdminRequest::Remediation(R::ClearMachine { address })
            | AdminRequest::Fence(protocol::admin::fence::FenceRequest::ListFor {
                machine: address,
                ..
            }) => address,
            AdminRequest::Remediation(R::Events(q)) => match &mut q.machine {
                Some(m) => m,
                None => return,
            },
            _ => return,
        };
        *name = self.fleet.resolve(name);
    }

    async fn diagnostics(
        &self,
        req: protocol::admin::diagnostics::DiagnosticsRequest,
    ) -> AdminResponse {
        use crate::repair::store::diagnostics::DiagnosticsStore;
        use protocol::admin::diagnostics::{DiagnosticsRequest, DiagnosticsResponse};
        let result = match req {
            DiagnosticsRequest::List { address } => self
                .store
                .bundles_of(address)
                .await
                .map(|l| Ok(DiagnosticsResponse::List(l))),
            DiagnosticsRequest::Get { address, id } => self
                .store
                .bundle(address.clone(), id)
                .await
                .map(|r| (r, address))
                .map(|(r, address)| match r {
                    Some(r) => Ok(DiagnosticsResponse::Get(Box::new(r))),
                    None => Err(match id {
                        Some(id) => format!("no diagnostics #{id} for {address}"),
                        None => format!(
                            "no diagnostics kept for {address}: they are collected by an @collect-diagnostics repair step"
                        ),
                    }),
                }),
        };
        match result {
            Ok(Ok(r)) => AdminResponse::Diagnostics(r),
            Ok(Err(reason)) => error(RefusalCode::BadRequest, reason),
            Err(e) => error(RefusalCode::Internal, e.to_string()),
        }
    }

    /// `machines show`'s answer: the fleet's detail with the machine's crash-dump notice.
    async fn machine_detail(
        &self,
        address: &str,
    ) -> Result<protocol::admin::machines::MachineDetail, FleetError> {
        match self.fleet.detail(address).await {
            Ok(Some(mut d)) => {
                d.kdump = self.kdump.as_ref().and_then(|k| k.detail(address));
                Ok(d)
            }
            Ok(None) => Err(FleetError::UnknownMachine(address.to_string())),
            Err(e) => Err(e),
        }
    }

    async fn machines(&self, who: &Identity, req: MachinesRequest) -> AdminResponse {
        let resp = match req {
            MachinesRequest::Delete { address, force } => {
                return self.delete_machine(&who.name, address, force).await;
            }
            MachinesRequest::SetState { address, state } => {
                return self.set_machine_state(&who.name, address, state).await;
            }
            MachinesRequest::List => Ok(MachinesResponse::List(self.fleet.list())),
            MachinesRequest::Show { address } => self
                .machine_detail(&address)
                .await
                .map(|d| MachinesResponse::Show(Box::new(readable_by_every_ctl(d)))),
            MachinesRequest::ShowWithInterval { address } => {
                self.machine_detail(&address).await.map(|d| {
                    let d = readable_by_every_ctl(d);
                    let report_interval_ms =
                        d.last_report.as_ref().map_or(0, |r| r.report_interval_ms);
                    MachinesResponse::ShowWithInterval {
                        detail: Box::new(d),
                        report_interval_ms,
                    }
                })
            }
            MachinesRequest::ShowWithChecks { address } => {
                self.machine_detail(&address).await.map(|d| {
                    let (report_interval_ms, newer_checks) =
                        d.last_report.as_ref().map_or((0, Vec::new()), |r| {
                            let newer = r
                                .checks
                                .iter()
                                .filter(|c| !c.kind.known_to_every_coordinator())
                                .cloned()
                                .collect();
                            (r.report_interval_ms, newer)
                        });
                    MachinesResponse::ShowWithChecks {
                        detail: Box::new(readable_by_every_ctl(d)),
                        report_interval_ms,
                        newer_checks,
                    }
                })
            }
            MachinesRequest::Add(spec) => {
                match MachineRecord::from_spec(&spec, RecordSource::Admin) {
                    Ok(rec) => {
                        tracing::info!(admin = %who.name, machine = %rec.address, hostname = %rec.hostname, "machine added");
                        self.fleet.upsert(vec![rec]).await.map(|mut v| {
                            MachinesResponse::Added(Box::new(
                                v.pop().expect("one record in, one out"),
                            ))
                        })
                    }
                    Err(e) => Err(e.into()),
                }
            }
            MachinesRequest::Import(specs) => {
                let recs: Result<Vec<_>, _> = specs
                    .iter()
                    .map(|s| MachineRecord::from_spec(s, RecordSource::Admin))
                    .collect();
                match recs {
                    Ok(recs) => {
                        tracing::info!(admin = %who.name, count = recs.len(), "machines imported");
                        self.fleet
                            .upsert(recs)
                            .await
                            .map(MachinesResponse::Imported)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        };
        match resp {
            Ok(r) => AdminResponse::Machines(r),
            Err(e) => fleet_error(e),
        }
    }
}
