//! Proof that a machine is down, the only key to releasing its workload.
//!
//! Releasing a node's workload (out-of-service taint, Node deletion) lets its pods and
//! volumes start elsewhere; doing that while the machine still runs them corrupts data.
//! So the release functions ([`crate::k8s::KubeDrainer::release`] and `restore`) take a
//! [`DownProof`], and a `DownProof` can only be made from:
//!
//! - a [`PowerOffProof`], which exists only as the result of [`confirm_power_off`] (a
//!   `fence` power action whose gateway answer says "off, confirmed at T") or
//!   [`reconfirm_power_off`] (a power-state read that says "off", for a flow resumed after a
//!   coordinator restart), and, for *restoring* a Node only, `from_committed_confirmation`
//!   (visible only inside `crate::fence`: the fence runner rebuilds the proof of a
//!   confirmation its flow committed, once the machine is on again after a restart; it never
//!   releases with one);
//! - a [`KdumpProof`], whose constructor is visible only inside `crate::fence`, where the
//!   fence runner builds it from the kdump view's "dumping" (the kdump initramfs's notice),
//!   read at the time of each release pass.
//!
//! The proof types have private fields and no public constructor, so no other code, in
//! this crate or outside it, can conjure one: invariant 1 is checked by the compiler.
//!
//! ```compile_fail,E0451
//! // Outside the fence module, a proof cannot be built from its fields…
//! let p = coordinator::fence::proof::PowerOffProof {
//!     address: "10.0.0.1".into(),
//!     request_id: "r".into(),
//!     confirmed_off: jiff::Timestamp::now(),
//! };
//! ```
//!
//! ```compile_fail,E0624
//! // …nor from a gateway answer someone wrote by hand…
//! use protocol::gateway::*;
//! let req = PowerRequest { id: "r".into(), address: "10.0.0.1".into(), serial: String::new(),
//!     action: PowerAction::Fence, timeout_ms: 0 };
//! let resp = PowerResponse { id: "r".into(), outcome: PowerOutcome::Done {
//!     state: PowerState::Off, confirmed_off_unix_ms: Some(1), detail: String::new() } };
//! let p = coordinator::fence::proof::PowerOffProof::from_fence_answer(&req, &resp);
//! ```
//!
//! ```compile_fail,E0624
//! // …nor from a committed record (the fence runner's restore-only constructor)…
//! let p = coordinator::fence::proof::PowerOffProof::from_committed_confirmation(
//!     "10.0.0.1", "r", jiff::Timestamp::now());
//! ```
//!
//! ```compile_fail,E0624
//! // …nor a kdump proof…
//! let p = coordinator::fence::proof::KdumpProof::from_dump_in_progress(
//!     "10.0.0.1", jiff::Timestamp::now());
//! ```
//!
//! ```compile_fail,E0308
//! // …and release cannot be called without one.
//! async fn f(d: &coordinator::k8s::KubeDrainer) {
//!     d.release("node-1", &(), &coordinator::k8s::release::Release::Taint).await;
//! }
//! ```
//!
//! The same call with a proof obtained the legitimate way compiles:
//!
//! ```no_run
//! use coordinator::fence::proof::{confirm_power_off, DownProof};
//! use coordinator::k8s::release::Release;
//! async fn f(
//!     d: &coordinator::k8s::KubeDrainer,
//!     power: &dyn coordinator::gateway::PowerControl,
//! ) -> anyhow::Result<()> {
//!     let proof: DownProof = confirm_power_off(power, "10.0.0.1", "SER1", "fence-1", 0).await?.into();
//!     d.release("node-1", &proof, &Release::Taint).await?;
//!     Ok(())
//! }
//! ```

use jiff::Timestamp;
use protocol::gateway::{PowerAction, PowerOutcome, PowerRequest, PowerResponse, PowerState};

use crate::clock::Clock;
use crate::gateway::{PowerControl, PowerError};

/// Why no proof could be had.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// The power request could not be carried out.
    #[error("power-off of {address} not confirmed: {source}")]
    Power {
        /// The machine.
        address: String,
        /// Cause.
        source: PowerError,
    },
    /// The gateway answered, but not with a confirmed power-off.
    #[error("power-off of {address} not confirmed: {detail}")]
    NotConfirmed {
        /// The machine.
        address: String,
        /// What the gateway said.
        detail: String,
        /// The gateway said retrying may help.
        retriable: bool,
    },
}

impl ProofError {
    /// True when asking again later may produce the proof.
    pub fn is_retriable(&self) -> bool {
        match self {
            ProofError::Power { source, .. } => source.is_retriable(),
            ProofError::NotConfirmed { retriable, .. } => *retriable,
        }
    }
}

/// A machine's power-off was confirmed by its BMC, through its rack gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerOffProof {
    address: String,
    request_id: String,
    confirmed_off: Timestamp,
    /// What the gateway said of the fence (which fencing level acted and why the levels
    /// before it did not); empty for a read-back or a committed confirmation.
    gateway_said: String,
}

impl PowerOffProof {
    /// Builds the proof from a gateway's answer to `req`, if and only if the answer confirms
    /// the machine is off. A `status` answer saying "off" counts only when re-confirming a
    /// fence (`reconfirmed_at`, the time of the read). Private to this module: the only
    /// callers are [`confirm_power_off`] and [`reconfirm_power_off`], which got the answer
    /// from a gateway, and [`fence_confirmed`], which returns no proof.
    fn from_fence_answer(
        req: &PowerRequest,
        resp: &PowerResponse,
        reconfirmed_at: Option<Timestamp>,
    ) -> Result<Self, ProofError> {
        let not = |detail: String, retriable| ProofError::NotConfirmed {
            address: req.address.clone(),
            detail,
            retriable,
        };
        if resp.id != req.id {
            return Err(not(
                format!("answer is for request {}, not {}", resp.id, req.id),
                true,
            ));
        }
        match (&req.action, &resp.outcome) {
            (
                PowerAction::Fence,
                PowerOutcome::Done {
                    state: PowerState::Off,
                    confirmed_off_unix_ms: Some(ms),
                    detail,
                },
            ) => Ok(Self {
                address: req.address.clone(),
                request_id: req.id.clone(),
                confirmed_off: Timestamp::from_millisecond(i64::try_from(*ms).unwrap_or(0))
                    .unwrap_or(Timestamp::UNIX_EPOCH),
                gateway_said: detail.clone(),
            }),
            (
                PowerAction::Status,
                PowerOutcome::Done {
                    state: PowerState::Off,
                    ..
                },
            ) => match reconfirmed_at {
                Some(at) => Ok(Self {
                    address: req.address.clone(),
                    request_id: req.id.clone(),
                    confirmed_off: at,
                    gateway_said: String::new(),
                }),
                None => Err(not(
                    "a power-state read confirms power-off only when re-confirming a fence".into(),
                    false,
                )),
            },
            (
                PowerAction::Fence | PowerAction::Status,
                PowerOutcome::Done { state, detail, .. },
            ) => Err(not(
                format!("BMC reports power {state:?} ({detail})"),
                false,
            )),
            // The gateway restarted while it ran the id: a fence or a read may be asked
            // again under a new id (a new attempt), never taken as an answer.
            (PowerAction::Fence | PowerAction::Status, PowerOutcome::Failed { detail, .. })
                if resp.outcome.is_outcome_unknown() =>
            {
                Err(not(detail.clone(), true))
            }
            (_, PowerOutcome::Failed { detail, retriable }) => Err(not(detail.clone(), *retriable)),
            (action, _) => Err(not(
                format!("a {action:?} action never proves power-off"),
                false,
            )),
        }
    }

    /// Rebuilds the proof of a confirmation a fence flow committed earlier, for *restoring*
    /// the Node after the flow powered the machine on again and the coordinator restarted
    /// (the machine is on by then, so no read can confirm off any more). Visible only inside
    /// `crate::fence`; the runner never uses it to release (it re-reads the power state).
    pub(in crate::fence) fn from_committed_confirmation(
        address: impl Into<String>,
        request_id: impl Into<String>,
        confirmed_off: Timestamp,
    ) -> Self {
        Self {
            address: address.into(),
            request_id: request_id.into(),
            confirmed_off,
            gateway_said: String::new(),
        }
    }

    /// What the gateway said of the fence that confirmed it: with fencing levels, which
    /// level acted and why the levels before it did not. Empty for a read-back.
    pub fn gateway_said(&self) -> &str {
        &self.gateway_said
    }

    /// The machine's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The power request whose answer confirmed it.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// When power-off was confirmed.
    pub fn confirmed_off(&self) -> Timestamp {
        self.confirmed_off
    }
}

/// A kdump is in progress on the machine: it runs nothing but the dump kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KdumpProof {
    address: String,
    dump_started: Timestamp,
}

impl KdumpProof {
    /// Builds the proof from a "dumping" notice received from the kdump initramfs (for a
    /// release: as the kdump view says it now; for a restore after a restart: as the flow
    /// committed it). Visible only inside `crate::fence`, where the kdump flow lives.
    pub(in crate::fence) fn from_dump_in_progress(
        address: impl Into<String>,
        dump_started: Timestamp,
    ) -> Self {
        Self {
            address: address.into(),
            dump_started,
        }
    }

    /// The machine's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// When the dump started.
    pub fn dump_started(&self) -> Timestamp {
        self.dump_started
    }
}

/// Proof that a machine is down, required to release its workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownProof {
    /// Power-off confirmed by the BMC.
    PowerOff(PowerOffProof),
    /// A kdump is in progress.
    Kdump(KdumpProof),
}

impl DownProof {
    /// The machine the proof is about.
    pub fn address(&self) -> &str {
        match self {
            DownProof::PowerOff(p) => p.address(),
            DownProof::Kdump(k) => k.address(),
        }
    }

    /// A line for Events and logs.
    pub fn describe(&self) -> String {
        match self {
            DownProof::PowerOff(p) => format!(
                "power-off of {} confirmed at {:.0} (request {})",
                p.address, p.confirmed_off, p.request_id
            ),
            DownProof::Kdump(k) => {
                format!(
                    "kdump in progress on {} since {:.0}",
                    k.address, k.dump_started
                )
            }
        }
    }
}

impl From<PowerOffProof> for DownProof {
    fn from(p: PowerOffProof) -> Self {
        DownProof::PowerOff(p)
    }
}

impl From<KdumpProof> for DownProof {
    fn from(k: KdumpProof) -> Self {
        DownProof::Kdump(k)
    }
}

async fn ask(
    power: &dyn PowerControl,
    req: PowerRequest,
    clock: Option<&dyn Clock>,
) -> Result<PowerOffProof, ProofError> {
    let resp = power
        .power(req.clone())
        .await
        .map_err(|source| ProofError::Power {
            address: req.address.clone(),
            source,
        })?;
    PowerOffProof::from_fence_answer(&req, &resp, clock.map(|c| c.now()))
}

/// Whether a gateway's answer to a `fence` request confirms power-off, and when: the one
/// meaning of "power-off confirmed", for callers that need the verdict but release nothing
/// (the repair queue's `@fence` built-in). Returns no proof, so it opens no release.
pub fn fence_confirmed(req: &PowerRequest, resp: &PowerResponse) -> Result<Timestamp, ProofError> {
    PowerOffProof::from_fence_answer(req, resp, None).map(|p| p.confirmed_off)
}

/// Fences the machine through its gateway (power off, then confirm off by reading the power
/// state) and returns the proof when the gateway confirms it is off. `request_id` makes the
/// request idempotent at the gateway; `timeout_ms` 0 takes the gateway's default.
pub async fn confirm_power_off(
    power: &dyn PowerControl,
    address: &str,
    serial: &str,
    request_id: &str,
    timeout_ms: u64,
) -> Result<PowerOffProof, ProofError> {
    ask(
        power,
        PowerRequest {
            id: request_id.into(),
            address: address.into(),
            serial: serial.into(),
            action: PowerAction::Fence,
            timeout_ms,
        },
        None,
    )
    .await
}

/// Reads the power state and returns the proof when the BMC says "off": for a fence flow
/// resumed after a restart, which must not trust a stored "it was off" alone. The proof's
/// confirmation time is the read's, from `clock`.
pub async fn reconfirm_power_off(
    power: &dyn PowerControl,
    clock: &dyn Clock,
    address: &str,
    serial: &str,
    request_id: &str,
) -> Result<PowerOffProof, ProofError> {
    ask(
        power,
        PowerRequest {
            id: request_id.into(),
            address: address.into(),
            serial: serial.into(),
            action: PowerAction::Status,
            timeout_ms: 0,
        },
        Some(clock),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeClock, FakePower};

    fn done(state: PowerState, ms: Option<u64>) -> PowerOutcome {
        PowerOutcome::Done {
            state,
            confirmed_off_unix_ms: ms,
            detail: "bmc".into(),
        }
    }

    #[tokio::test]
    async fn only_a_confirmed_off_makes_a_proof() {
        let p = FakePower::default();
        for outcome in [
            done(PowerState::Off, Some(1_700_000_000_000)),
            done(PowerState::On, None),
            done(PowerState::Off, None),
            PowerOutcome::Failed {
                detail: "bmc busy".into(),
                retriable: true,
            },
            done(PowerState::Off, None),
        ] {
            p.then(Ok(outcome));
        }
        let proof = confirm_power_off(&p, "10.0.0.1", "S", "r1", 0)
            .await
            .unwrap();
        assert_eq!(proof.address(), "10.0.0.1");
        assert_eq!(proof.confirmed_off().as_millisecond(), 1_700_000_000_000);
        assert!(
            confirm_power_off(&p, "10.0.0.1", "S", "r2", 0)
                .await
                .is_err()
        );
        // A fence answer without a confirmation time is not a confirmation.
        assert!(
            confirm_power_off(&p, "10.0.0.1", "S", "r3", 0)
                .await
                .is_err()
        );
        let e = confirm_power_off(&p, "10.0.0.1", "S", "r4", 0)
            .await
            .unwrap_err();
        assert!(e.is_retriable());
        let clock = FakeClock::new(Timestamp::from_second(1_800_000_000).unwrap());
        let proof = reconfirm_power_off(&p, &clock, "10.0.0.1", "S", "r5")
            .await
            .unwrap();
        assert_eq!(
            proof.confirmed_off(),
            clock.now(),
            "stamped with the injected clock"
        );
    }

    #[test]
    fn a_cycle_or_mismatched_answer_is_not_proof() {
        let req = |action| PowerRequest {
            id: "r".into(),
            address: "a".into(),
            serial: String::new(),
            action,
            timeout_ms: 0,
        };
        let resp = |id: &str| PowerResponse {
            id: id.into(),
            outcome: done(PowerState::Off, Some(5)),
        };
        let proof = |action, id| PowerOffProof::from_fence_answer(&req(action), &resp(id), None);
        assert!(proof(PowerAction::Cycle, "r").is_err());
        assert!(proof(PowerAction::Off, "r").is_err());
        assert!(proof(PowerAction::Fence, "x").is_err());
        assert!(proof(PowerAction::Fence, "r").is_ok());
        // The verdict `@fence` uses is the same one.
        assert!(fence_confirmed(&req(PowerAction::Fence), &resp("r")).is_ok());
        assert!(fence_confirmed(&req(PowerAction::Fence), &resp("x")).is_err());
        assert!(
            fence_confirmed(&req(PowerAction::Status), &resp("r")).is_err(),
            "a status read is not a fence"
        );
        let k: DownProof = KdumpProof::from_dump_in_progress("a", Timestamp::UNIX_EPOCH).into();
        assert_eq!(k.address(), "a");
    }
}
