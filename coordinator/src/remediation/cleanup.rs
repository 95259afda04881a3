//! The loop's own finished entries: the succeeded ones it enqueued are deleted
//! `[remediation] delete_succeeded_after` after they succeeded, so that a machine can be
//! repaired again without a person (CKE's limiter holds a machine while any entry for it
//! exists). Failed entries, and entries a person added, stay for a person.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;
use protocol::admin::repair::{RepairEntry, RepairQueueRequest, RepairQueueResponse};

use super::config::RemediationConfig;
use super::shared::LoopDeps;
use crate::repair::Requester;

/// Deletes the succeeded entries this loop enqueued that finished at least
/// `delete_succeeded_after` ago (never in observe mode, which changes nothing), and
/// marks them deleted in `queue` so this pass already sees their machines free.
/// Returns the deleted entries, for the journal. A failed deletion is logged and tried
/// again next pass.
pub(super) async fn delete_succeeded(
    own: &HashSet<u64>,
    deps: &LoopDeps,
    queue: &mut [RepairEntry],
    cfg: &RemediationConfig,
    now: Timestamp,
) -> Vec<RepairEntry> {
    let (Some(after), false, Some(q)) = (cfg.delete_succeeded_after, cfg.observe, &deps.queue)
    else {
        return Vec::new();
    };
    let mut deleted = Vec::new();
    for e in queue.iter_mut() {
        if !succeeded_long_enough(e, own, after, now) {
            continue;
        }
        match q
            .request_by(
                RepairQueueRequest::Delete { index: e.index },
                Requester::remediation(&format!(
                    "succeeded-entry-deleted: delete_succeeded_after {}",
                    super::human(after)
                )),
            )
            .await
        {
            Ok(RepairQueueResponse::Deleted { .. }) => {
                e.deleted = true;
                tracing::info!(
                    entry = e.index,
                    machine = %e.address,
                    "succeeded repair queue entry deleted (delete_succeeded_after)"
                );
                deleted.push(e.clone());
            }
            other => tracing::warn!(
                entry = e.index,
                machine = %e.address,
                answer = ?other,
                "cannot delete a succeeded repair queue entry; trying again next pass"
            ),
        }
    }
    deleted
}

/// Whether `e` is a succeeded entry of this loop's (`own`), not yet deleted, that finished at
/// least `after` before `now`.
fn succeeded_long_enough(
    e: &RepairEntry,
    own: &HashSet<u64>,
    after: Duration,
    now: Timestamp,
) -> bool {
    e.status == protocol::admin::repair::RepairStatus::Succeeded
        && !e.deleted
        && own.contains(&e.index)
        && finished_ago(now, e) >= after
}

/// How long ago entry `e` last changed (for a finished one: finished).
pub(super) fn finished_ago(now: Timestamp, e: &RepairEntry) -> Duration {
    let at = i64::try_from(e.last_transition_time_unix_ms).unwrap_or(0);
    super::elapsed(now, crate::clock::from_unix_ms(at))
}
