//! High availability: several coordinators share one etcd store; one leads and acts, the
//! others stand by and take over when it goes.
//!
//! - [`config`]: the `[ha]` section (the lease TTL, the advertised address).
//! - [`election`]: campaigning with a create-if-absent transaction on the leader key, bound
//!   to a lease; the epoch is the key's create revision; a standby watches the key.
//! - [`keepalive`]: the leader keeps its lease alive and watches its key; the term ends the
//!   moment either is gone or no keep-alive was answered for a TTL (monotonic clock).
//! - [`role`]: the shared [`RoleHandle`] every acting loop, `/healthz`, `/metrics` and the
//!   fencing tokens read.
//! - [`lead`]: campaign, hold, and on the term's end mark the role deposed and fire the
//!   token the coordinator stops on.
//! - [`metrics`]: the role as Prometheus series.
//! - [`renew`]: `coordinator renew-identity`, a new store identity after an etcd snapshot
//!   restore, never under a leader.
//!
//! Every write of a leader is fenced by its epoch in the store itself
//! (`crate::store::etcd::fence`), so a deposed leader that has not noticed yet writes
//! nothing. A deposed coordinator exits (`crate::lifecycle`) for systemd to restart it as a
//! standby; `docs/design.md` ("High availability") says why. With SQLite there is one
//! coordinator: [`RoleHandle::sole`] always leads.

pub mod config;
pub mod election;
pub mod keepalive;
pub mod lead;
pub mod metrics;
pub mod renew;
pub mod role;

pub use config::HaSection;
pub use election::{Candidate, LEADER_KEY, Leadership};
pub use lead::{EXIT_DEPOSED, campaign_and_hold};
pub use role::{LeaderRecord, Role, RoleHandle};
