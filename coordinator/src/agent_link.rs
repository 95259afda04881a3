//! Asking a node-agent for an action over the connection it opened to us.
//!
//! [`AgentLinks`] holds the live QUIC connection of every connected agent, keyed by the
//! machine's address, registered by [`crate::agent_server`] after the agent's certificate
//! and hello were checked and removed when that session ends. [`AgentActions::act`] opens
//! a stream on that connection, sends one [`ActionRequest`] and reads the answers. The
//! coordinator never dials an agent: a machine without a live connection is unreachable
//! and the call fails at once, so a repair procedure moves on to its next (power) step.
//!
//! Every request carries the coordinator's fencing token ([`crate::lease_token`]), read when
//! it is sent, on connections of [`FENCING_VERSION`] or later; an agent of an older release
//! gets the request alone. An agent that has seen a newer epoch of this store refuses it
//! ([`ActionFailure::OlderEpoch`]); the refusal comes back as the action's answer, and is
//! logged here. With no token (this coordinator does not lead) nothing is sent.
//!
//! Which agent is asked is decided here by the address only; the connection itself was
//! authenticated as that machine's node certificate, so no other node can be asked through
//! it, and nodes cannot open action streams towards anyone (agents accept them, the
//! coordinator never does).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use protocol::actions::{
    ActionFailure, ActionReply, ActionRequest, ActionStatus, AgentAction, FencedActionRequest,
    MAX_ACTION_FRAME_LEN,
};
use protocol::fencing::{FENCING_VERSION, FencingToken};
use protocol::transport::{TransportError, read_msg, write_msg};
use quinn::Connection;

use crate::lease_token::LeaseToken;

/// Why an action could not be asked for or its answer not read.
#[derive(Debug, thiserror::Error)]
pub enum AgentActionError {
    /// The machine's agent is not connected.
    #[error(
        "the agent of {address} is not connected (unreachable); a graceful action is not possible"
    )]
    NotConnected {
        /// The machine.
        address: String,
    },
    /// The connection failed while asking or waiting.
    #[error("the agent of {address} went away during {action}: {detail}")]
    Lost {
        /// The machine.
        address: String,
        /// The action.
        action: String,
        /// What failed.
        detail: String,
    },
    /// No final answer within the time limit (an agent from before actions never answers).
    #[error(
        "the agent of {address} did not answer {action} within {timeout:?} (an agent older than action support never answers)"
    )]
    Timeout {
        /// The machine.
        address: String,
        /// The action.
        action: String,
        /// The limit.
        timeout: Duration,
    },
    /// The agent accepted the request but gave no final answer within the time limit: its
    /// command still runs (the agent's own `[actions] command_timeout` ends it).
    #[error(
        "the agent of {address} accepted {action} but its command was still running after {timeout:?}; the agent limits it to its [actions] command_timeout, so give this step at least that long"
    )]
    StillRunning {
        /// The machine.
        address: String,
        /// The action.
        action: String,
        /// The limit.
        timeout: Duration,
    },
    /// This coordinator holds no fencing token (it does not lead): nothing was sent.
    #[error(
        "{action} was not asked of the agent of {address}: this coordinator holds no fencing token (it does not lead)"
    )]
    NoToken {
        /// The machine.
        address: String,
        /// The action.
        action: String,
    },
}

impl AgentActionError {
    /// A lost connection may come back; a missing agent or a timeout is for the next step.
    pub fn is_retriable(&self) -> bool {
        matches!(self, AgentActionError::Lost { .. })
    }
}

/// How an action ended, as far as the coordinator saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionAnswer {
    /// Whether the agent accepted the request before its final status (or before the stream
    /// ended, for a reboot).
    pub accepted: bool,
    /// The final status; `None` when the stream ended after `Accepted` (a reboot).
    pub status: Option<ActionStatus>,
}

/// Agent actions as the repair queue needs them. Implemented by [`AgentLinks`]; faked in
/// tests.
pub trait AgentActions: Send + Sync + 'static {
    /// Asks the agent of `address` for `action` under request `id`, waiting up to `timeout`
    /// for its final answer.
    fn act(
        &self,
        address: &str,
        id: &str,
        action: AgentAction,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ActionAnswer, AgentActionError>>;
}

/// Nobody connected: every action fails as unreachable.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAgentLinks;

impl AgentActions for NoAgentLinks {
    fn act(
        &self,
        address: &str,
        _id: &str,
        _action: AgentAction,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<ActionAnswer, AgentActionError>> {
        let address = address.to_string();
        Box::pin(async move { Err(AgentActionError::NotConnected { address }) })
    }
}

/// QUIC application close code of a session whose machine was deleted (`machines delete`):
/// the agent reconnects, and its hello registers it again, as awaiting registration.
pub const CLOSE_DELETED: u32 = 3;

/// The connections of the agents connected now.
#[derive(Debug, Default)]
pub struct AgentLinks {
    /// address → (session number, connection, protocol version spoken on it).
    links: Mutex<HashMap<String, (u64, Connection, u16)>>,
    next: Mutex<u64>,
    /// The token every request is sent with.
    lease: LeaseToken,
}

impl AgentLinks {
    /// An empty registry whose requests carry the token `lease` holds when each is sent.
    pub fn new(lease: LeaseToken) -> Arc<Self> {
        Arc::new(Self {
            lease,
            ..Self::default()
        })
    }

    /// Registers the connection of the agent of `address` as its current session; returns
    /// the session number to pass to [`AgentLinks::remove`] and [`AgentLinks::is_current`],
    /// and the connection it replaced, if one was registered (the caller closes it: one
    /// machine, one session).
    pub fn insert(
        &self,
        address: &str,
        conn: Connection,
        version: u16,
    ) -> (u64, Option<Connection>) {
        let n = {
            let mut next = self.next.lock().expect("links lock");
            *next += 1;
            *next
        };
        let old = self
            .links
            .lock()
            .expect("links lock")
            .insert(address.to_string(), (n, conn, version));
        (n, old.map(|(_, c, _)| c))
    }

    /// Closes the session of the machine at `address`, which was just deleted, so that its
    /// agent reconnects and shows up as awaiting registration at once instead of reporting
    /// about a machine the coordinator no longer has. True when one was connected.
    pub fn close_deleted(&self, address: &str) -> bool {
        let Some((conn, _)) = self.get(address) else {
            return false;
        };
        conn.close(
            CLOSE_DELETED.into(),
            b"machine deleted by an admin; reconnect to register again",
        );
        true
    }

    /// True while session `n` is the current one of `address` (no newer one replaced it).
    pub fn is_current(&self, address: &str, n: u64) -> bool {
        self.links
            .lock()
            .expect("links lock")
            .get(address)
            .is_some_and(|(m, _, _)| *m == n)
    }

    /// Forgets session `n` of `address`, unless a newer session replaced it.
    pub fn remove(&self, address: &str, n: u64) {
        let mut links = self.links.lock().expect("links lock");
        if links.get(address).is_some_and(|(m, _, _)| *m == n) {
            links.remove(address);
        }
    }

    /// Datagrams received so far on the connections of the agents of `addresses` (those
    /// connected), by address: what the health sweep reads to tell a live, silent agent from
    /// a dead machine. The connections are read after the registry's lock is released.
    pub fn received(&self, addresses: &[String]) -> HashMap<String, u64> {
        if addresses.is_empty() {
            return HashMap::new();
        }
        let conns: Vec<(String, Connection)> = {
            let links = self.links.lock().expect("links lock");
            addresses
                .iter()
                .filter_map(|a| links.get(a).map(|(_, c, _)| (a.clone(), c.clone())))
                .collect()
        };
        conns
            .into_iter()
            .map(|(a, c)| {
                let n = c.stats().udp_rx.datagrams;
                (a, n)
            })
            .collect()
    }

    fn get(&self, address: &str) -> Option<(Connection, u16)> {
        self.links
            .lock()
            .expect("links lock")
            .get(address)
            .map(|(_, c, v)| (c.clone(), *v))
    }
}

async fn ask(
    (conn, version): (Connection, u16),
    req: ActionRequest,
    token: FencingToken,
    accepted: &std::sync::atomic::AtomicBool,
) -> Result<ActionAnswer, TransportError> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(TransportError::from)?;
    if version >= FENCING_VERSION {
        let fenced = FencedActionRequest {
            request: req.clone(),
            token,
        };
        write_msg(&mut send, &fenced, MAX_ACTION_FRAME_LEN).await?;
    } else {
        write_msg(&mut send, &req, MAX_ACTION_FRAME_LEN).await?;
    }
    let _ = send.finish();
    let mut answer = ActionAnswer {
        accepted: false,
        status: None,
    };
    while let Some(reply) = read_msg::<ActionReply>(&mut recv, MAX_ACTION_FRAME_LEN).await? {
        if reply.id != req.id {
            continue;
        }
        if reply.status.is_final() {
            answer.status = Some(reply.status);
            break;
        }
        answer.accepted = true;
        accepted.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(answer)
}

impl AgentActions for AgentLinks {
    fn act(
        &self,
        address: &str,
        id: &str,
        action: AgentAction,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ActionAnswer, AgentActionError>> {
        let address = address.to_string();
        let conn = self.get(&address);
        let token = self.lease.current();
        let req = ActionRequest {
            id: id.to_string(),
            action,
        };
        Box::pin(async move {
            let Some(conn) = conn else {
                return Err(AgentActionError::NotConnected { address });
            };
            let what = req.action.describe();
            let Some(token) = token else {
                return Err(AgentActionError::NoToken {
                    address,
                    action: what,
                });
            };
            tracing::info!(machine = %address, id = %req.id, action = %what, epoch = token.epoch, "asking the agent");
            let accepted = std::sync::atomic::AtomicBool::new(false);
            let id = req.id.clone();
            let epoch = token.epoch;
            match tokio::time::timeout(timeout, ask(conn, req, token, &accepted)).await {
                Err(_) if accepted.load(std::sync::atomic::Ordering::Relaxed) => {
                    Err(AgentActionError::StillRunning {
                        address,
                        action: what,
                        timeout,
                    })
                }
                Err(_) => Err(AgentActionError::Timeout {
                    address,
                    action: what,
                    timeout,
                }),
                Ok(Err(e)) => Err(AgentActionError::Lost {
                    address,
                    action: what,
                    detail: e.to_string(),
                }),
                Ok(Ok(a)) => {
                    if let Some(ActionStatus::Failed {
                        code: ActionFailure::OlderEpoch,
                        detail,
                    }) = &a.status
                    {
                        tracing::error!(machine = %address, %id, action = %what, epoch, %detail, "the agent refused this coordinator's action: a coordinator of a newer epoch of this store has spoken to it, so this one no longer leads; nothing was done");
                    }
                    Ok(a)
                }
            }
        })
    }
}
