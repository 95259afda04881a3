//! What the agents' sessions change: a hello (a known machine, or a host the inventory
//! does not name, recorded as awaiting registration), each report, a goodbye, a closed
//! connection.

use std::collections::BTreeMap;
use std::net::IpAddr;

use protocol::messages::{AgentHello, GoodbyeReason, HealthReport};

use super::index::{Entry, Live, row};
use super::store::Write;
use super::{Fleet, FleetError};
use crate::health::MachineState;
use crate::inventory::{MachineRecord, RecordSource};

impl Fleet {
    /// An agent's hello was accepted for `hostname` (from its certificate). Returns the
    /// machine's address. A host no record names is recorded as awaiting registration,
    /// keyed by the first address it reports that no record holds (else the connection's
    /// source address, else its hostname), without a machine type.
    pub async fn agent_hello(
        &self,
        hostname: &str,
        hello: &AgentHello,
        remote: IpAddr,
    ) -> Result<String, FleetError> {
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut writes = Vec::new();
        let entry = 'entry: {
            let mut inner = self.lock();
            if let Some(addr) = inner.by_hostname.get(hostname).cloned() {
                let e = inner
                    .machines
                    .get_mut(&addr)
                    .expect("hostname index points at a machine");
                if e.live.new_boot(&hello.boot_id, now) {
                    tracing::info!(machine = %addr, hostname, boot_id = %hello.boot_id, "machine rebooted");
                }
                writes.extend(e.live.boot_write(&addr));
                e.live.agent_version = Some(hello.agent_version.clone());
                e.live.connections += 1;
                e.live.heard = None;
                if !e.record.serial.is_empty()
                    && !hello.serial.is_empty()
                    && e.record.serial != hello.serial
                {
                    // Trusted anyway (the certificate names the host), but a person should
                    // know: a board swap, or a certificate on the wrong server.
                    tracing::warn!(
                        machine = %addr,
                        hostname,
                        registered = %e.record.serial,
                        reported = %hello.serial,
                        "agent reports another serial than the inventory"
                    );
                }
                if !hello.addresses.is_empty()
                    && !hello.addresses.iter().any(|a| a.to_string() == addr)
                {
                    tracing::info!(
                        machine = %addr,
                        hostname,
                        reported = ?hello.addresses,
                        "registered address is not among the agent's addresses"
                    );
                }
                // Known machine: only its boot id may need storing, after the lock.
                break 'entry Err(addr);
            }
            // The address the host says it has, as an operator will type it in `machines
            // add`; the UDP source may be a NAT or a second interface.
            let free = |a: &String| !inner.machines.contains_key(a);
            let address = hello
                .addresses
                .iter()
                .map(IpAddr::to_string)
                .find(free)
                .or_else(|| Some(remote.to_string()).filter(free))
                .unwrap_or_else(|| hostname.to_string());
            let mut live = Live::default();
            live.new_boot(&hello.boot_id, now);
            live.agent_version = Some(hello.agent_version.clone());
            live.connections = 1;
            let e = Entry {
                record: MachineRecord {
                    address: address.clone(),
                    hostname: hostname.to_string(),
                    serial: hello.serial.clone(),
                    rack: String::new(),
                    role: String::new(),
                    machine_type: None,
                    labels: BTreeMap::new(),
                    source: RecordSource::Agent,
                },
                state: MachineState::AwaitingRegistration,
                since: now,
                reason: format!(
                    "hello from unregistered host {hostname} at {remote}; register it with \
                     `coordinatorctl machines add`"
                ),
                live,
            };
            tracing::warn!(
                hostname,
                %remote,
                machine = %address,
                "hello from a host not in the inventory; recorded as awaiting registration"
            );
            writes.push(Write::Row(row(&e, now)));
            writes.push(Write::Transition {
                address: address.clone(),
                from: String::new(),
                to: e.state,
                at: now,
                reason: e.reason.clone(),
            });
            Ok(e)
        };
        let entry = match entry {
            Ok(e) => e,
            Err(known) => {
                self.commit(writes, Vec::new(), Vec::new()).await?;
                return Ok(known);
            }
        };
        let address = entry.record.address.clone();
        self.commit(writes, vec![entry], Vec::new()).await?;
        Ok(address)
    }

    /// Records a report from the agent of `hostname` (the name in its certificate) and
    /// re-derives its machine's state.
    pub async fn report(&self, hostname: &str, report: HealthReport) -> Result<(), FleetError> {
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut writes = Vec::new();
        let changed = {
            let mut inner = self.lock();
            let e = inner
                .by_hostname_mut(hostname)
                .ok_or_else(|| FleetError::UnknownHost(hostname.to_string()))?;
            let address = e.record.address.clone();
            if e.live.new_boot(&report.boot_id, now) {
                tracing::info!(machine = %address, boot_id = %report.boot_id, "machine rebooted");
            }
            writes.extend(e.live.boot_write(&address));
            let failing: Vec<String> = report
                .failing()
                .map(|c| format!("{}:{}", c.kind.as_str(), c.subject))
                .collect();
            let kinds: Vec<&str> = report.failing().map(|c| c.kind.as_str()).collect();
            e.live
                .failing_kinds_since
                .retain(|k, _| kinds.contains(&k.as_str()));
            for k in kinds {
                e.live
                    .failing_kinds_since
                    .entry(k.to_string())
                    .or_insert(now);
            }
            e.live.failing_since.retain(|k, _| failing.contains(k));
            for k in failing {
                e.live.failing_since.entry(k).or_insert(now);
            }
            if report.all_ok() {
                e.live.healthy_since.get_or_insert(now);
            } else {
                e.live.healthy_since = None;
            }
            if e.state == MachineState::Unreachable && e.live.goodbye.is_none() {
                e.live.last_silence = Some((e.live.last_report_at.unwrap_or(e.since), now));
            }
            e.live.goodbye = None;
            e.live.last_report_at = Some(now);
            e.live.last_report = Some(report);
            e.live.heard = None;
            self.changed_copy(e, now, &mut writes)
        };
        self.commit(writes, changed, Vec::new()).await
    }

    /// Records a goodbye from the agent of `hostname`: the machine is stopping on purpose.
    pub async fn goodbye(&self, hostname: &str, reason: GoodbyeReason) -> Result<(), FleetError> {
        let _gate = self.gate.lock().await;
        let now = self.clock.now();
        let mut writes = Vec::new();
        let changed = {
            let mut inner = self.lock();
            let e = inner
                .by_hostname_mut(hostname)
                .ok_or_else(|| FleetError::UnknownHost(hostname.to_string()))?;
            e.live.goodbye = Some((reason, now));
            e.live.healthy_since = None;
            self.changed_copy(e, now, &mut writes)
        };
        self.commit(writes, changed, Vec::new()).await
    }

    /// An agent connection of `hostname` closed.
    pub async fn disconnected(&self, hostname: &str) {
        let _gate = self.gate.lock().await;
        if let Some(e) = self.lock().by_hostname_mut(hostname) {
            e.live.connections = e.live.connections.saturating_sub(1);
        }
    }
}
