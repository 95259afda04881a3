//! Fence flows on etcd: [`FenceStore`] for [`EtcdStore`].
//!
//! Keys under the store's prefix (`docs/design.md`, "The etcd store"):
//! - `fence/write-index`: the next flow id;
//! - `fence/flows/<id>`: one flow, JSON (state by its kind, times in RFC 3339, the release
//!   plan with the saved Node metadata);
//! - `fence/history/<id>/<n>`: the flow's history lines, numbered by
//!   `fence/history-index/<id>`;
//! - `fence/active/<address>`: `{"flow": id}` while the machine has an unfinished flow;
//!   created with the flow in one transaction only if absent, so one machine never has two,
//!   and deleted in the transaction that ends the flow;
//! - `fence/machines/<address>/<id>`: `{}` for each flow of the machine (its listing and
//!   the pruning of old finished flows read it);
//! - `fence/steps/<step key>`: `{"entry": …, "flow": …, "created_ms": …}`, which repair step
//!   started which flow (created only if absent: a step keeps its first flow), with
//!   `fence/flow-steps/<id>/<step key>` pointing back.
//!
//! A state change and its history line are one transaction that compares the flow's
//! `mod_revision` as read, so a note "only in state X" never lands after a change. Pruning a
//! machine's old finished flows runs after the transaction that ended a flow, as its own
//! transactions: it only deletes flows already finished and unlinked, so a coordinator killed
//! in between leaves one flow more, never one less. Addresses and step keys are escaped
//! (`%` and `/`) so that a key never grows a level.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{FenceStore, HistoryLine, KEPT_FINISHED_PER_MACHINE};
use crate::clock::to_unix_ms;
use crate::fence::flow::{Flow, KdumpLeg, State};
use crate::k8s::release::Release;
use crate::store::StoreError;
use crate::store::etcd::kv::num_key;
use crate::store::etcd::{EtcdError, EtcdStore, Sequence, Versioned};

const FLOWS: &str = "fence/flows";
const HISTORY: &str = "fence/history";
const ACTIVE: &str = "fence/active";
const MACHINES: &str = "fence/machines";
const STEPS: &str = "fence/steps";
const FLOW_STEPS: &str = "fence/flow-steps";
/// The repair queue's entries (the repair area's key), read when pruning: a flow a queued
/// entry started is kept.
const REPAIR_ENTRIES: &str = "repair/entries";

fn flows() -> Sequence {
    Sequence::new("fence/write-index", FLOWS)
}

/// A flow's history: its own write index, so that flows running side by side never race
/// on one counter.
fn history_seq(id: u64) -> Sequence {
    Sequence::new(
        format!("fence/history-index/{}", num_key(id)),
        format!("{HISTORY}/{}", num_key(id)),
    )
}

/// `s` as one key level: `%` and `/` escaped.
fn level(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

fn flow_key(id: u64) -> String {
    format!("{FLOWS}/{}", num_key(id))
}

fn active_key(address: &str) -> String {
    format!("{ACTIVE}/{}", level(address))
}

fn machine_key(address: &str, id: u64) -> String {
    format!("{MACHINES}/{}/{}", level(address), num_key(id))
}

/// Attempts at a history line whose flow did not change but whose index moved (a second
/// writer on the same flow, which one coordinator never is).
const HISTORY_ATTEMPTS: u32 = 8;

fn err(e: EtcdError) -> StoreError {
    StoreError::from(e)
}

/// A flow as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct FlowRecord {
    id: u64,
    address: String,
    serial: String,
    node: String,
    keep_off: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id_before: Option<String>,
    state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    state_detail: String,
    state_since: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline: Option<Timestamp>,
    power_attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    how: Option<Release>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    confirmed_off: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    confirm_request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    powered_on: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kdump: Option<KdumpRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct KdumpRecord {
    started: Timestamp,
    until: Timestamp,
    released: bool,
}

impl FlowRecord {
    fn of(f: &Flow) -> Self {
        Self {
            id: f.id,
            address: f.address.clone(),
            serial: f.serial.clone(),
            node: f.node.clone(),
            keep_off: f.keep_off,
            boot_id_before: f.boot_id_before.clone(),
            state: f.state.kind().to_string(),
            state_detail: match &f.state {
                State::Failed { detail } => detail.clone(),
                _ => String::new(),
            },
            state_since: f.state_since,
            deadline: f.deadline,
            power_attempt: f.power_attempt,
            how: f.how.clone(),
            confirmed_off: f.confirmed_off,
            confirm_request: f.confirm_request.clone(),
            powered_on: f.powered_on,
            failure: f.failure.clone(),
            kdump: f.kdump.map(|k| KdumpRecord {
                started: k.started,
                until: k.until,
                released: k.released,
            }),
        }
    }

    fn into_flow(self, key: &str) -> Result<Flow, StoreError> {
        let state = State::parse(&self.state, &self.state_detail).ok_or_else(|| {
            err(EtcdError::Json {
                key: key.to_string(),
                source: <serde_json::Error as serde::de::Error>::custom(format!(
                    "unknown fence flow state {:?}",
                    self.state
                )),
            })
        })?;
        Ok(Flow {
            id: self.id,
            address: self.address,
            serial: self.serial,
            node: self.node,
            keep_off: self.keep_off,
            boot_id_before: self.boot_id_before,
            state,
            state_since: self.state_since,
            deadline: self.deadline,
            power_attempt: self.power_attempt,
            how: self.how,
            confirmed_off: self.confirmed_off,
            confirm_request: self.confirm_request,
            powered_on: self.powered_on,
            failure: self.failure,
            kdump: self.kdump.map(|k| KdumpLeg {
                started: k.started,
                until: k.until,
                released: k.released,
            }),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct HistoryRecord {
    at: Timestamp,
    state: String,
    event: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct ActiveRecord {
    flow: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct StepRecord {
    entry: u64,
    flow: u64,
    created_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Empty {}

fn finished(s: &State) -> bool {
    matches!(s, State::Done | State::Failed { .. })
}

impl EtcdStore {
    async fn flow(&self, id: u64) -> Result<Option<Versioned<Flow>>, StoreError> {
        let key = flow_key(id);
        match self.kv_get::<FlowRecord>(&key).await.map_err(err)? {
            None => Ok(None),
            Some(v) => Ok(Some(Versioned {
                value: v.value.into_flow(&self.key(&key))?,
                mod_revision: v.mod_revision,
                create_revision: v.create_revision,
            })),
        }
    }

    /// Appends a history line of flow `id` (in state `state`) with whatever `more` adds, in
    /// one transaction that also compares the flow's `mod_revision` with `flow_rev`; false
    /// when the flow changed in between (nothing written). A history index that moved alone
    /// is read again.
    async fn with_history(
        &self,
        id: u64,
        flow_rev: i64,
        state: &State,
        event: &str,
        now: Timestamp,
        more: impl Fn(crate::store::etcd::Txn) -> Result<crate::store::etcd::Txn, EtcdError>,
    ) -> Result<bool, StoreError> {
        let seq = history_seq(id);
        let line = HistoryRecord {
            at: now,
            state: state.kind().to_string(),
            event: event.to_string(),
        };
        let key = flow_key(id);
        for _ in 0..HISTORY_ATTEMPTS {
            let (n, rev) = self
                .kv_get::<u64>(&seq.index)
                .await
                .map_err(err)?
                .map(|v| (v.value, v.mod_revision))
                .unwrap_or((1, 0));
            let txn = more(self.txn().if_mod_revision(&key, flow_rev))
                .and_then(|t| {
                    t.if_mod_revision(&seq.index, rev)
                        .put(&seq.index, &(n + 1))?
                        .put(&seq.item(n), &line)
                })
                .map_err(err)?;
            if txn.commit().await.map_err(err)? {
                return Ok(true);
            }
            let now_rev = self.flow(id).await?.map(|f| f.mod_revision);
            if now_rev != Some(flow_rev) {
                return Ok(false);
            }
        }
        Err(err(EtcdError::Contended {
            key: self.key(&seq.index),
            attempts: HISTORY_ATTEMPTS,
        }))
    }

    /// Deletes `address`'s finished flows older than its newest [`KEPT_FINISHED_PER_MACHINE`]
    /// finished ones, except a flow a repair entry still in the queue started.
    async fn prune_finished(&self, address: &str) -> Result<(), StoreError> {
        let dir = format!("{MACHINES}/{}", level(address));
        let ids: Vec<u64> = self
            .kv_keys(&dir)
            .await
            .map_err(err)?
            .iter()
            .filter_map(|k| k.parse().ok())
            .collect();
        let mut finished_ids = Vec::new();
        for id in ids.iter().rev() {
            if let Some(f) = self.flow(*id).await?
                && finished(&f.value.state)
            {
                finished_ids.push((*id, f.mod_revision));
            }
        }
        for (id, rev) in finished_ids
            .into_iter()
            .skip(KEPT_FINISHED_PER_MACHINE as usize)
        {
            let links = self
                .kv_list::<StepRecord>(&format!("{FLOW_STEPS}/{}", num_key(id)))
                .await
                .map_err(err)?;
            let mut queued = false;
            for (_, l) in &links {
                let entry = format!("{REPAIR_ENTRIES}/{}", num_key(l.value.entry));
                if self
                    .kv_get::<serde_json::Value>(&entry)
                    .await
                    .map_err(err)?
                    .is_some()
                {
                    queued = true;
                }
            }
            if queued {
                continue;
            }
            let mut txn = self
                .txn()
                .if_mod_revision(&flow_key(id), rev)
                .delete(&flow_key(id))
                .delete(&machine_key(address, id))
                .delete_dir(&format!("{HISTORY}/{}", num_key(id)))
                .delete(&history_seq(id).index)
                .delete_dir(&format!("{FLOW_STEPS}/{}", num_key(id)));
            for (step, _) in &links {
                txn = txn.delete(&format!("{STEPS}/{step}"));
            }
            txn.commit().await.map_err(err)?;
        }
        Ok(())
    }

    async fn flows_of(&self, ids: impl IntoIterator<Item = u64>) -> Result<Vec<Flow>, StoreError> {
        let mut out = Vec::new();
        for id in ids {
            if let Some(f) = self.flow(id).await? {
                out.push(f.value);
            }
        }
        Ok(out)
    }
}

impl FenceStore for EtcdStore {
    async fn start(
        &self,
        flow: Flow,
        event: String,
        now: Timestamp,
    ) -> Result<Option<u64>, StoreError> {
        let active = active_key(&flow.address);
        if self
            .kv_get::<ActiveRecord>(&active)
            .await
            .map_err(err)?
            .is_some()
        {
            return Ok(None);
        }
        let line = HistoryRecord {
            at: now,
            state: flow.state.kind().to_string(),
            event,
        };
        let r = flows()
            .append(self, |id, txn| {
                let mut f = flow.clone();
                f.id = id;
                let hist = history_seq(id);
                txn.if_absent(&active)
                    .put(&flow_key(id), &FlowRecord::of(&f))?
                    .put(&active, &ActiveRecord { flow: id })?
                    .put(&machine_key(&f.address, id), &Empty {})?
                    .put(&hist.item(1), &line)?
                    .put(&hist.index, &2u64)
            })
            .await;
        match r {
            Ok(id) => Ok(Some(id)),
            // The machine got a flow, or the history index moved, in between: which one?
            Err(EtcdError::Contended { .. }) => {
                if self
                    .kv_get::<ActiveRecord>(&active)
                    .await
                    .map_err(err)?
                    .is_some()
                {
                    Ok(None)
                } else {
                    Err(err(EtcdError::Contended {
                        key: self.key("fence/write-index"),
                        attempts: 1,
                    }))
                }
            }
            Err(e) => Err(err(e)),
        }
    }

    async fn update(&self, flow: Flow, event: String, now: Timestamp) -> Result<(), StoreError> {
        let Some(cur) = self.flow(flow.id).await? else {
            return Err(err(EtcdError::Json {
                key: self.key(&flow_key(flow.id)),
                source: <serde_json::Error as serde::de::Error>::custom("no such fence flow"),
            }));
        };
        let ends = finished(&flow.state);
        let active = active_key(&flow.address);
        let active_rev = if ends {
            self.kv_get::<ActiveRecord>(&active)
                .await
                .map_err(err)?
                .filter(|a| a.value.flow == flow.id)
                .map(|a| a.mod_revision)
        } else {
            None
        };
        let key = flow_key(flow.id);
        let ok = self
            .with_history(flow.id, cur.mod_revision, &flow.state, &event, now, |txn| {
                let mut txn = txn.put(&key, &FlowRecord::of(&flow))?;
                if let Some(rev) = active_rev {
                    txn = txn.if_mod_revision(&active, rev).delete(&active);
                }
                Ok(txn)
            })
            .await?;
        if !ok {
            return Err(err(EtcdError::Conflict {
                key: self.key(&key),
            }));
        }
        if ends && let Err(e) = self.prune_finished(&flow.address).await {
            tracing::warn!(error = %e, machine = %flow.address, "pruning old fence flows failed; they are pruned when the next flow ends");
        }
        Ok(())
    }

    async fn note(
        &self,
        id: u64,
        only_in: Option<State>,
        event: String,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let Some(cur) = self.flow(id).await? else {
            return Err(err(EtcdError::Json {
                key: self.key(&flow_key(id)),
                source: <serde_json::Error as serde::de::Error>::custom("no such fence flow"),
            }));
        };
        if only_in.as_ref().is_some_and(|s| *s != cur.value.state) {
            return Ok(false);
        }
        let ok = self
            .with_history(id, cur.mod_revision, &cur.value.state, &event, now, Ok)
            .await?;
        if !ok && only_in.is_some() {
            // The flow changed in between: the note is for a state it may have left.
            return Ok(false);
        }
        Ok(ok)
    }

    async fn load(&self, id: u64) -> Result<Option<Flow>, StoreError> {
        Ok(self.flow(id).await?.map(|v| v.value))
    }

    async fn unfinished(&self) -> Result<Vec<Flow>, StoreError> {
        let mut ids: Vec<u64> = self
            .kv_list::<ActiveRecord>(ACTIVE)
            .await
            .map_err(err)?
            .into_iter()
            .map(|(_, v)| v.value.flow)
            .collect();
        ids.sort_unstable();
        let flows = self.flows_of(ids).await?;
        Ok(flows.into_iter().filter(|f| !finished(&f.state)).collect())
    }

    async fn list(&self, limit: u32) -> Result<Vec<Flow>, StoreError> {
        self.kv_list_last::<FlowRecord>(FLOWS, limit)
            .await
            .map_err(err)?
            .into_iter()
            .map(|(k, v)| v.value.into_flow(&self.key(&format!("{FLOWS}/{k}"))))
            .collect()
    }

    async fn list_for(&self, address: String, limit: u32) -> Result<Vec<Flow>, StoreError> {
        let ids: Vec<u64> = self
            .kv_list_last::<Empty>(&format!("{MACHINES}/{}", level(&address)), limit)
            .await
            .map_err(err)?
            .into_iter()
            .filter_map(|(k, _)| k.parse().ok())
            .collect();
        self.flows_of(ids).await
    }

    async fn history(&self, id: u64) -> Result<Vec<HistoryLine>, StoreError> {
        Ok(history_seq(id)
            .items::<HistoryRecord>(self)
            .await
            .map_err(err)?
            .into_iter()
            .map(|(_, v)| HistoryLine {
                at: v.value.at,
                state: v.value.state,
                event: v.value.event,
            })
            .collect())
    }

    async fn flow_of_step(&self, key: String) -> Result<Option<u64>, StoreError> {
        Ok(self
            .kv_get::<StepRecord>(&format!("{STEPS}/{}", level(&key)))
            .await
            .map_err(err)?
            .map(|v| v.value.flow))
    }

    async fn link_step(
        &self,
        key: String,
        entry: u64,
        flow: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let step = format!("{STEPS}/{}", level(&key));
        let rec = StepRecord {
            entry,
            flow,
            created_ms: to_unix_ms(now),
        };
        self.txn()
            .if_absent(&step)
            .put(&step, &rec)
            .and_then(|t| {
                t.put(
                    &format!("{FLOW_STEPS}/{}/{}", num_key(flow), level(&key)),
                    &rec,
                )
            })
            .map_err(err)?
            .commit()
            .await
            .map_err(err)?;
        Ok(())
    }
}

/// A repair step's link to the flow it started, as `coordinator migrate` brings it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepLink {
    /// The step's key.
    pub(crate) step: String,
    /// The repair entry.
    pub(crate) entry: u64,
    /// The flow.
    pub(crate) flow: u64,
    /// When it was linked (Unix ms).
    pub(crate) created_ms: i64,
}

impl EtcdStore {
    /// `coordinator migrate`: writes one flow under its own id with its history as it was
    /// (times included), its machine's listing key, its `active` key when unfinished (created
    /// only if absent: one machine, one unfinished flow) and the step links that name it, in
    /// one transaction when it fits etcd's operation limit.
    pub(crate) async fn import_fence_flow(
        &self,
        flow: &Flow,
        history: &[HistoryLine],
        links: &[StepLink],
    ) -> Result<(), StoreError> {
        let key = flow_key(flow.id);
        let seq = history_seq(flow.id);
        let mut txn = self
            .txn()
            .if_absent(&key)
            .put(&key, &FlowRecord::of(flow))
            .and_then(|t| t.put(&machine_key(&flow.address, flow.id), &Empty {}))
            .and_then(|t| t.put(&seq.index, &(history.len() as u64 + 1)))
            .map_err(err)?;
        if !finished(&flow.state) {
            let active = active_key(&flow.address);
            txn = txn
                .if_absent(&active)
                .put(&active, &ActiveRecord { flow: flow.id })
                .map_err(err)?;
        }
        for l in links {
            let rec = StepRecord {
                entry: l.entry,
                flow: l.flow,
                created_ms: l.created_ms,
            };
            let step = level(&l.step);
            txn = txn
                .put(&format!("{STEPS}/{step}"), &rec)
                .and_then(|t| t.put(&format!("{FLOW_STEPS}/{}/{step}", num_key(flow.id)), &rec))
                .map_err(err)?;
        }
        let mut first = true;
        for (i, line) in history.iter().enumerate() {
            if txn.len() >= crate::repair::store::etcd::MAX_TXN_OPS {
                if !txn.commit().await.map_err(err)? && first {
                    return Err(err(EtcdError::Conflict {
                        key: self.key(&key),
                    }));
                }
                first = false;
                txn = self.txn();
            }
            let rec = HistoryRecord {
                at: line.at,
                state: line.state.clone(),
                event: line.event.clone(),
            };
            txn = txn.put(&seq.item(i as u64 + 1), &rec).map_err(err)?;
        }
        if !txn.commit().await.map_err(err)? && first {
            return Err(err(EtcdError::Conflict {
                key: self.key(&key),
            }));
        }
        Ok(())
    }

    /// `coordinator migrate`, after every flow: the next flow id, so that no id the source
    /// gave out is given out again.
    pub(crate) async fn import_fence_write_index(&self, next_id: u64) -> Result<(), StoreError> {
        self.txn()
            .put(flows().index.as_str(), &next_id)
            .map_err(err)?
            .commit()
            .await
            .map_err(err)?;
        Ok(())
    }
}
