//! The one seam between the gateway and a BMC: [`PowerControl`], with what a BMC can be asked
//! ([`ChassisOp`]) and how it can fail ([`BmcError`]).
//!
//! Real implementations are [`crate::ipmi::IpmiPowerControl`] and
//! [`crate::redfish::RedfishPowerControl`]; tests use [`fake::FakePower`]. This module holds no
//! policy: what an action means (confirming a fence, cycling an off machine) lives in
//! [`crate::actions`].

use futures::future::BoxFuture;
pub use protocol::gateway::PowerState;

/// A primitive a BMC is asked to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChassisOp {
    /// Power on.
    On,
    /// Hard power off.
    Off,
    /// ACPI soft off (the OS shuts down).
    SoftOff,
    /// Power cycle (off, then on).
    Cycle,
    /// Hard reset.
    Reset,
}

impl ChassisOp {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChassisOp::On => "on",
            ChassisOp::Off => "off",
            ChassisOp::SoftOff => "soft-off",
            ChassisOp::Cycle => "cycle",
            ChassisOp::Reset => "reset",
        }
    }
}

/// Why a BMC operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcError {
    /// No answer within the time allowed (after retries).
    #[error("BMC {bmc} did not answer {what} within {waited_ms} ms")]
    Timeout {
        /// The BMC.
        bmc: String,
        /// What was asked.
        what: String,
        /// How long we waited.
        waited_ms: u64,
    },
    /// The BMC could not be reached at all (refused, no route, RMCP ping unanswered).
    #[error("BMC {bmc} unreachable: {detail}")]
    Unreachable {
        /// The BMC.
        bmc: String,
        /// What was seen.
        detail: String,
    },
    /// The BMC refused our credentials.
    #[error("BMC {bmc} refused the credentials: {detail}; check the username and password file")]
    Auth {
        /// The BMC.
        bmc: String,
        /// What the BMC said.
        detail: String,
    },
    /// The BMC answered with an error.
    #[error("BMC {bmc} refused {what}: {detail}")]
    Refused {
        /// The BMC.
        bmc: String,
        /// What was asked.
        what: String,
        /// What the BMC said (completion code, HTTP status and message).
        detail: String,
    },
    /// The BMC refused for now because it is busy (IPMI completion code 0xC0 "node busy" or
    /// 0xD2 "BMC initializing"; Redfish 409 Conflict or 503 Service Unavailable): typically
    /// a power-on shortly after a power-off.
    #[error("BMC {bmc} is busy and refused {what} for now: {detail}")]
    Busy {
        /// The BMC.
        bmc: String,
        /// What was asked.
        what: String,
        /// What the BMC said.
        detail: String,
    },
    /// The BMC answered something we could not understand.
    #[error("BMC {bmc} sent an unexpected answer to {what}: {detail}")]
    Protocol {
        /// The BMC.
        bmc: String,
        /// What was asked.
        what: String,
        /// What was received.
        detail: String,
    },
    /// The BMC does not offer the operation.
    #[error("BMC {bmc} does not support {what}: {detail}")]
    Unsupported {
        /// The BMC.
        bmc: String,
        /// What was asked.
        what: String,
        /// What it offers instead.
        detail: String,
    },
}

impl BmcError {
    /// True when trying again later may succeed (timeouts, unreachable, busy); false when
    /// the configuration or the BMC must change first.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            BmcError::Timeout { .. }
                | BmcError::Unreachable { .. }
                | BmcError::Protocol { .. }
                | BmcError::Busy { .. }
        )
    }

    /// True when the BMC itself did not answer (for the reachability metric).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            BmcError::Timeout { .. } | BmcError::Unreachable { .. }
        )
    }
}

/// A power state as read, with the BMC's own word when the state alone would hide it (a
/// Redfish `PoweringOn`, `PoweringOff`, `Paused`, or a value the gateway does not know): an
/// operator must tell a BMC in the middle of a power change from a broken one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerReading {
    /// What the state counts as (only `Off` ever confirms a fence).
    pub state: PowerState,
    /// What the BMC said and what it means, for a person; `None` when it said plainly on or
    /// off.
    pub note: Option<String>,
}

impl PowerReading {
    /// A reading that is just `state`.
    pub fn plain(state: PowerState) -> Self {
        Self { state, note: None }
    }

    /// `on`, `off` or `unknown`, followed by the note in parentheses when there is one.
    pub fn describe(&self) -> String {
        let s = match self.state {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::Unknown => "unknown",
        };
        match &self.note {
            Some(n) => format!("{s} ({n})"),
            None => s.to_string(),
        }
    }
}

/// Talks to one BMC. Implementations keep whatever session state they need; the gateway
/// calls one method at a time per BMC (see [`crate::worker`]).
pub trait PowerControl: Send + Sync + 'static {
    /// Reads the chassis power state.
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>>;

    /// Reads the chassis power state with the BMC's own word for it when that is not plainly
    /// on or off. Wrappers must forward it; the default knows no word.
    fn power_reading(&self) -> BoxFuture<'_, Result<PowerReading, BmcError>> {
        Box::pin(async move { self.power_state().await.map(PowerReading::plain) })
    }

    /// Carries out `op`; returns what the BMC said, for a person.
    fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>>;

    /// Closes any session with the BMC (at shutdown). Errors are only logged.
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// A hand-written fake BMC for unit tests.
pub mod fake {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// What the fake does on the next calls.
    #[derive(Debug, Default)]
    struct State {
        power: Option<PowerState>,
        calls: Vec<String>,
        /// Scripted errors for the next calls, in order (None = behave normally).
        script: VecDeque<Option<BmcError>>,
        /// Number of `power_state` reads after an off before the state reads off.
        off_lag: u32,
        lag_left: u32,
        /// Number of `power_state` reads after a cycle that read off (mid-cycle).
        cycle_off: u32,
        cycle_off_left: u32,
        delay: Duration,
        /// Calls running now, and the most ever running at once.
        in_flight: usize,
        max_in_flight: usize,
    }

    /// A fake BMC: keeps a power state, records calls and how many ran at once, plays
    /// scripted errors.
    #[derive(Debug, Default)]
    pub struct FakePower {
        state: Mutex<State>,
    }

    impl FakePower {
        /// A fake whose machine is in `power`.
        pub fn new(power: PowerState) -> Self {
            let f = Self::default();
            f.state.lock().unwrap().power = Some(power);
            f
        }

        /// After an off, the state keeps reading on for `reads` more reads.
        pub fn with_off_lag(self, reads: u32) -> Self {
            self.state.lock().unwrap().off_lag = reads;
            self
        }

        /// After a cycle, the state reads off for `reads` reads, as a BMC that holds the
        /// machine off for a while in the middle of its cycle.
        pub fn with_cycle_off(self, reads: u32) -> Self {
            self.state.lock().unwrap().cycle_off = reads;
            self
        }

        /// Each call takes `d`.
        pub fn with_delay(self, d: Duration) -> Self {
            self.state.lock().unwrap().delay = d;
            self
        }

        /// The next call fails with `e`.
        pub fn fail_next(&self, e: BmcError) {
            self.state.lock().unwrap().script.push_back(Some(e));
        }

        /// The next call behaves normally (to interleave with `fail_next`).
        pub fn ok_next(&self) {
            self.state.lock().unwrap().script.push_back(None);
        }

        /// Calls so far, e.g. `["status", "off", "status"]`.
        pub fn calls(&self) -> Vec<String> {
            self.state.lock().unwrap().calls.clone()
        }

        /// The most calls that were ever running at the same time (1 when the gateway keeps
        /// to one action per BMC).
        pub fn max_in_flight(&self) -> usize {
            self.state.lock().unwrap().max_in_flight
        }

        /// Current power state.
        pub fn power(&self) -> PowerState {
            self.state
                .lock()
                .unwrap()
                .power
                .unwrap_or(PowerState::Unknown)
        }

        async fn enter(&self, call: &str) -> Result<(), BmcError> {
            let (delay, scripted) = {
                let mut s = self.state.lock().unwrap();
                s.calls.push(call.to_string());
                s.in_flight += 1;
                s.max_in_flight = s.max_in_flight.max(s.in_flight);
                (s.delay, s.script.pop_front().flatten())
            };
            // Counts the call as finished even when its future is dropped (a timeout).
            let _running = InFlight(self);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match scripted {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }

    struct InFlight<'a>(&'a FakePower);

    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.state.lock().unwrap().in_flight -= 1;
        }
    }

    impl PowerControl for FakePower {
        fn power_state(&self) -> BoxFuture<'_, Result<PowerState, BmcError>> {
            Box::pin(async move {
                self.enter("status").await?;
                let mut s = self.state.lock().unwrap();
                if s.lag_left > 0 {
                    s.lag_left -= 1;
                    return Ok(PowerState::On);
                }
                if s.cycle_off_left > 0 {
                    s.cycle_off_left -= 1;
                    return Ok(PowerState::Off);
                }
                Ok(s.power.unwrap_or(PowerState::Unknown))
            })
        }

        fn chassis(&self, op: ChassisOp) -> BoxFuture<'_, Result<String, BmcError>> {
            Box::pin(async move {
                self.enter(op.as_str()).await?;
                let mut s = self.state.lock().unwrap();
                s.cycle_off_left = if op == ChassisOp::Cycle {
                    s.cycle_off
                } else {
                    0
                };
                match op {
                    ChassisOp::On | ChassisOp::Cycle | ChassisOp::Reset => {
                        s.power = Some(PowerState::On)
                    }
                    ChassisOp::Off | ChassisOp::SoftOff => {
                        s.power = Some(PowerState::Off);
                        s.lag_left = s.off_lag;
                    }
                }
                Ok(format!("fake: {} accepted", op.as_str()))
            })
        }

        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                self.state.lock().unwrap().calls.push("close".into());
            })
        }
    }
}
