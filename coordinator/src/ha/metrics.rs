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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::etcd::fence::Term;
    use std::time::{Duration, Instant};

    fn value(out: &str, series: &str) -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing in\n{out}"))
            .to_string()
    }

    #[test]
    fn the_role_is_rendered_as_leader_epoch_and_changes() {
        let mut out = String::new();
        RoleMetrics(RoleHandle::sole()).render(&mut out);
        assert_eq!(value(&out, "fleetmend_coordinator_leader"), "1");
        assert_eq!(value(&out, "fleetmend_coordinator_leader_epoch"), "0");
        let r = RoleHandle::elected();
        r.lead(Arc::new(Term::new(
            9,
            Instant::now() + Duration::from_secs(60),
        )));
        r.deposed("test");
        out.clear();
        RoleMetrics(r).render(&mut out);
        assert_eq!(value(&out, "fleetmend_coordinator_leader"), "0");
        assert_eq!(value(&out, "fleetmend_coordinator_leader_epoch"), "9");
        assert_eq!(
            value(&out, "fleetmend_coordinator_role{role=\"deposed\"}"),
            "1"
        );
        assert_eq!(
            value(&out, "fleetmend_coordinator_leadership_changes_total"),
            "2"
        );
    }
}
