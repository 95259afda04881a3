//! The role as Prometheus series: whether this coordinator leads, the epoch it knows of,
//! and how often it took or lost the lead. Summed over the coordinators of one store,
//! `fleetmend_coordinator_leader` is 1 when all is well; the packaged alert rules fire on 0
//! ("no leader") and on a fast-growing `fleetmend_coordinator_leadership_changes_total`
//! ("leadership flapping").

use std::fmt::Write as _;
use std::sync::Arc;

use super::role::RoleHandle;
use crate::metrics::MetricsSource;

/// Renders a [`RoleHandle`].
#[derive(Debug, Clone)]
pub struct RoleMetrics(pub Arc<RoleHandle>);

impl MetricsSource for RoleMetrics {
    fn render(&self, out: &mut String) {
        let role = self.0.current();
        let leading = u8::from(self.0.is_leading());
        let _ = writeln!(
            out,
            "# HELP fleetmend_coordinator_leader 1 while this coordinator leads and may act\n\
             # TYPE fleetmend_coordinator_leader gauge\n\
             fleetmend_coordinator_leader {leading}"
        );
        let _ = writeln!(
            out,
            "# HELP fleetmend_coordinator_role This coordinator's role (1 for the current one)\n\
             # TYPE fleetmend_coordinator_role gauge"
        );
        for name in ["starting", "leader", "standby", "deposed"] {
            let v = u8::from(role.name() == name);
            let _ = writeln!(out, "fleetmend_coordinator_role{{role=\"{name}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP fleetmend_coordinator_leader_epoch The epoch of the leadership this coordinator knows of (its own or the leader's; 0 without an election)\n\
             # TYPE fleetmend_coordinator_leader_epoch gauge\n\
             fleetmend_coordinator_leader_epoch {}",
            role.epoch().unwrap_or(0)
        );
        let _ = writeln!(
            out,
            "# HELP fleetmend_coordinator_leadership_changes_total Times this coordinator took or lost the lead\n\
             # TYPE fleetmend_coordinator_leadership_changes_total counter\n\
             fleetmend_coordinator_leadership_changes_total {}",
            self.0.changes()
        );
    }
}
