//! The etcd store's health probe, for `/healthz` ([`Probe`]): like SQLite's it runs on
//! [`crate::store::health::probe_loop`]'s timer so a quiet coordinator still notices etcd going away, but it writes
//! nothing. Agents' reports never write to the store and neither does the probe, so etcd's
//! revision stands still while nothing changes (issue 30's "reports never write").
//!
//! A linearizable read of the schema key goes through etcd's quorum, so it fails (within the
//! request timeout) when etcd is down or has no leader; the alarm list catches the one case
//! where reads work and writes do not: the space quota (NOSPACE) or a corrupt member.

use etcd_client::{AlarmAction, AlarmType};

use super::{EtcdError, EtcdStore, schema};
use crate::store::{Probe, StoreError};

impl EtcdStore {
    /// Reads through etcd's quorum and asks for its alarms; marks the store healthy, or
    /// failing with why.
    pub async fn probe_quorum(&self) -> Result<(), EtcdError> {
        let key = self.key(schema::SCHEMA_KEY);
        self.get_raw(&key).await?;
        let alarms = self
            .bounded("alarm list", &key, |c| {
                let mut m = c.maintenance_client();
                async move { m.alarm(AlarmAction::Get, AlarmType::None, None).await }
            })
            .await?;
        let raised: Vec<String> = alarms
            .alarms()
            .iter()
            .filter(|a| a.alarm() != AlarmType::None)
            .map(|a| format!("{:?} on member {:x}", a.alarm(), a.member_id()))
            .collect();
        if !raised.is_empty() {
            let e = EtcdError::Request {
                op: "alarm list",
                key,
                endpoints: self.endpoints().to_string(),
                reason: format!(
                    "etcd refuses writes: alarm {} raised (NOSPACE: compact and defragment, \
                     then `etcdctl alarm disarm`; CORRUPT: replace the member)",
                    raised.join(", ")
                ),
                storage: true,
            };
            self.health().failed(e.to_string());
            return Err(e);
        }
        self.wrote();
        Ok(())
    }
}

impl Probe for EtcdStore {
    async fn probe(&self) -> Result<(), StoreError> {
        Ok(self.probe_quorum().await?)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.get_raw(&self.key(schema::SCHEMA_KEY)).await?;
        Ok(())
    }
}
