//! From campaign to step-down, as the coordinator runs it: campaign until leading, then hold
//! the lead in the background; when the term ends, the role turns [`super::Role::Deposed`]
//! the process groups of the repair commands it runs are killed, and the `lost` token fires,
//! which the coordinator treats as its shutdown (every loop stops) before it exits with
//! [`EXIT_DEPOSED`] for systemd to start it again as a standby.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::election::{Candidate, Leadership};
use super::keepalive;

/// The exit status of a coordinator whose leadership ended (`EX_TEMPFAIL`): systemd's
/// `Restart=on-failure` starts it again, as a standby.
pub const EXIT_DEPOSED: u8 = 75;

/// Campaigns until this coordinator leads (`None` when `stop` fired first), then holds the
/// lead in a task: when the term ends, the role is marked deposed and `lost` is cancelled;
/// when `resign` fires first, it resigns (a standby takes over at once). The coordinator
/// fires `resign` once its loops have stopped, so no successor acts beside them.
pub async fn campaign_and_hold(
    candidate: &Candidate,
    stop: &CancellationToken,
    resign: CancellationToken,
    lost: CancellationToken,
) -> Option<(Leadership, JoinHandle<()>)> {
    let l = candidate.campaign(stop).await?;
    let role = candidate.role().clone();
    let holder = tokio::spawn({
        let l = l.clone();
        async move {
            match keepalive::hold(&l, &resign).await {
                Some(why) => {
                    tracing::error!(epoch = l.epoch, reason = %why, "this coordinator no longer leads: it stops acting and exits for systemd to restart it as a standby");
                    role.deposed(&why);
                    // Its commands act on machines a successor now owns: killed first.
                    let killed = crate::repair::command::kill_running_groups();
                    if killed > 0 {
                        tracing::warn!(
                            killed,
                            "killed the process groups of the repair commands this coordinator was running"
                        );
                    }
                    lost.cancel();
                }
                None => l.resign().await,
            }
        }
    });
    Some((l, holder))
}
