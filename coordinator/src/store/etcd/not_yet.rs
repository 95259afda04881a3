//! The areas whose etcd driver is not written yet: machine records and their transitions,
//! command process groups, diagnostics bundles, and the remediation journal with its
//! switches and outcomes (issue 30 item 3, left for the next step).
//!
//! Every method answers [`EtcdError::NotYetOnEtcd`] naming the area, never a made-up
//! result, and the configuration does not let a coordinator start on etcd until these are
//! written (`Store::open_configured` answers `backend = "etcd"` with `StoreError::NotBuilt`).
//! The repair queue, fence flows, kdump notices and the store identity are built
//! (`repair/store/etcd.rs`, `fence/store/etcd.rs`, `kdump/store/etcd.rs`, `schema.rs`) and pass
//! the conformance suite (`tests/tests/store_conformance.rs`) on both backends.

use jiff::Timestamp;
use protocol::admin::diagnostics::{DiagnosticsRecord, DiagnosticsSummary};
use protocol::admin::machines::StateTransition;
use protocol::admin::remediation::{EventsQuery, JournalLine};

use super::{EtcdError, EtcdStore};
use crate::fleet::store::{MachineStore, StoredMachine, Write as MachineWrite};
use crate::remediation::input::RepairOutcome;
use crate::remediation::journal::JournalWrite;
use crate::remediation::store::{RemediationStore, Resume, Switchboard};
use crate::repair::store::Write as RepairWrite;
use crate::repair::store::diagnostics::{DiagnosticsStore, NewBundle};
use crate::repair::store::groups::{CommandGroupStore, GroupRecord};
use crate::store::StoreError;

fn missing<T>(area: &'static str) -> Result<T, StoreError> {
    Err(EtcdError::NotYetOnEtcd { area }.into())
}

const MACHINES: &str = "machine records";
const GROUPS: &str = "command process groups";
const DIAGNOSTICS: &str = "diagnostics bundles";
const REMEDIATION: &str = "remediation journal and switches";

impl MachineStore for EtcdStore {
    async fn machines(&self) -> Result<Vec<StoredMachine>, StoreError> {
        missing(MACHINES)
    }

    async fn persist(&self, _writes: Vec<MachineWrite>) -> Result<(), StoreError> {
        missing(MACHINES)
    }

    async fn transitions(
        &self,
        _address: String,
        _limit: i64,
    ) -> Result<Vec<StateTransition>, StoreError> {
        missing(MACHINES)
    }
}

impl CommandGroupStore for EtcdStore {
    async fn record_group(&self, _record: GroupRecord, _now: Timestamp) -> Result<(), StoreError> {
        missing(GROUPS)
    }

    fn forget_group(&self, _pgid: u32) -> Result<(), StoreError> {
        missing(GROUPS)
    }

    async fn groups(&self) -> Result<Vec<GroupRecord>, StoreError> {
        missing(GROUPS)
    }

    async fn reaped(&self, _history: Vec<RepairWrite>, _now: Timestamp) -> Result<(), StoreError> {
        missing(GROUPS)
    }
}

impl DiagnosticsStore for EtcdStore {
    async fn keep_bundle(&self, _bundle: NewBundle) -> Result<u64, StoreError> {
        missing(DIAGNOSTICS)
    }

    async fn bundles_of(&self, _address: String) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        missing(DIAGNOSTICS)
    }

    async fn bundles_for_entry(&self, _index: u64) -> Result<Vec<DiagnosticsSummary>, StoreError> {
        missing(DIAGNOSTICS)
    }

    async fn bundle(
        &self,
        _address: String,
        _id: Option<u64>,
    ) -> Result<Option<DiagnosticsRecord>, StoreError> {
        missing(DIAGNOSTICS)
    }
}

impl RemediationStore for EtcdStore {
    async fn switchboard(&self) -> Result<Switchboard, StoreError> {
        missing(REMEDIATION)
    }

    async fn set_switch(
        &self,
        _key: String,
        _value: Option<String>,
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        missing(REMEDIATION)
    }

    async fn clear_machine(
        &self,
        _address: String,
        _at_ms: i64,
    ) -> Result<Option<bool>, StoreError> {
        missing(REMEDIATION)
    }

    async fn resume(
        &self,
        _admitted_since_ms: i64,
        _outcomes_since_ms: i64,
        _last_pass_since_ms: i64,
    ) -> Result<Resume, StoreError> {
        missing(REMEDIATION)
    }

    async fn write_journal(&self, _writes: Vec<JournalWrite>) -> Result<Vec<i64>, StoreError> {
        missing(REMEDIATION)
    }

    async fn prune_journal(&self, _before_ms: i64, _max_rows: u64) -> Result<usize, StoreError> {
        missing(REMEDIATION)
    }

    async fn events(&self, _query: EventsQuery) -> Result<Vec<JournalLine>, StoreError> {
        missing(REMEDIATION)
    }

    async fn add_outcomes(
        &self,
        _new: Vec<(u64, RepairOutcome)>,
        _before_ms: i64,
    ) -> Result<(), StoreError> {
        missing(REMEDIATION)
    }

    async fn update_own_entries(
        &self,
        _added: Vec<(u64, String)>,
        _gone: Vec<u64>,
        _at_ms: i64,
    ) -> Result<(), StoreError> {
        missing(REMEDIATION)
    }
}
