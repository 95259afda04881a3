//! The health sweep: how silent machines become unreachable, and how a silent agent that
//! QUIC still hears from is told apart from a dead machine.

use std::collections::HashMap;
use std::time::Duration;

use super::index::Entry;
use super::{Fleet, FleetError};
use crate::health::Derived;

impl Fleet {
    /// How long after its last report an agent counts as late, for
    /// [`Fleet::silent_connected`]: half an interval past its next report is due. By then the
    /// acknowledgement of its last reply (received within a round trip of the report) is in
    /// the count first sampled, and an agent that is alive but silent sends a keep-alive
    /// (after 10 s without sending) later. Agents that report on time are never sampled.
    /// The interval is the one the agent announced, if it did.
    fn late_after(&self, e: &Entry) -> Duration {
        (self.cfg.interval_for(e.live.last_report.as_ref()) * 3 / 2).max(Duration::from_secs(1))
    }

    /// The machines whose agent is connected but has not reported for a while (see
    /// [`Fleet::late_after`]): the ones [`Fleet::sweep_heard`] wants datagram counts for.
    /// Only the late ones, so the sweep reads no connection in a fleet that reports.
    pub fn silent_connected(&self) -> Vec<String> {
        let now = self.clock.now();
        self.lock()
            .machines
            .values()
            .filter(|e| {
                e.live.connections > 0
                    && e.live
                        .last_report_at
                        .is_some_and(|at| crate::health::elapsed(now, at) > self.late_after(e))
            })
            .map(|e| e.record.address.clone())
            .collect()
    }

    /// Re-derives every machine's state at the current time: this is how silent machines
    /// become unreachable. Returns the transitions made.
    pub async fn sweep(&self) -> Result<Vec<(String, Derived)>, FleetError> {
        self.sweep_heard(&HashMap::new()).await
    }

    /// [`Fleet::sweep`], noting first how many datagrams the connections of silent agents
    /// have received (`received`, by address, for [`Fleet::silent_connected`]), so that a
    /// silent machine whose agent still answers QUIC is told apart from a dead one.
    pub async fn sweep_heard(
        &self,
        received: &HashMap<String, u64>,
    ) -> Result<Vec<(String, Derived)>, FleetError> {
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut writes = Vec::new();
        let mut made = Vec::new();
        let changed: Vec<Entry> = {
            let mut inner = self.lock();
            for (address, n) in received {
                if let Some(e) = inner.machines.get_mut(address) {
                    e.live.note_received(*n);
                }
            }
            inner
                .machines
                .values()
                .filter_map(|e| {
                    let d = self.evaluate(e, now)?;
                    made.push((e.record.address.clone(), d.clone()));
                    let mut e = e.clone();
                    Self::transition(&mut e, d, now, &mut writes);
                    Some(e)
                })
                .collect()
        };
        self.commit(writes, changed, Vec::new()).await?;
        Ok(made)
    }
}
