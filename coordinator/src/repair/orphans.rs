//! Commands that outlive their coordinator: the record of each running command's process
//! group, and the kill of what a killed coordinator left behind before its step runs again
//! (invariant 8).
//!
//! SIGTERM stops the coordinator cleanly and its commands' groups are killed on the way out
//! ([`super::command`]'s guard). SIGKILL, an OOM kill or a panic under `panic = "abort"`
//! skip that, and the command runs on. So every external command's group is written to
//! the store ([`GroupLedger::record`]) right after it is spawned and removed when it ends; at
//! start, before any entry resumes, [`reap_previous`] kills the groups still recorded and
//! says so in the entry's history.
//!
//! A pid is only signalled when it is provably the same process group ([`verdict`]): same
//! boot, and the leader still has the start time recorded (`/proc/<pid>/stat` field 22);
//! or the leader is gone but members remain whose session is the one recorded. A pid
//! number cannot be reused while a group of that number has members, so such members are
//! the leader's own descendants.
//!
//! This module decides nothing about the entry; the engine resumes it as before.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::entry::{Entry, HistoryEvent};
use super::store::Write;
use super::store::groups::CommandGroupStore;
pub use super::store::groups::GroupRecord;
use crate::clock::Clock;
use crate::store::{Store, StoreError};

/// How long [`reap_previous`] waits for a killed group to vanish. SIGKILL cannot be caught;
/// the kernel needs milliseconds, a loaded machine maybe a second.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Where the kernel says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The fields of `/proc/<pid>/stat` this module uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: u32,
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Process group id (field 5).
    pub pgid: u32,
    /// Session id (field 6).
    pub session: u32,
    /// Start time in clock ticks after boot (field 22).
    pub start: u64,
}

impl ProcStat {
    /// Parses the text of `/proc/<pid>/stat`. The command name (field 2) may hold spaces
    /// and parentheses, so fields are counted from its last `)`.
    pub fn parse(text: &str) -> Option<Self> {
        let (head, rest) = text.rsplit_once(')')?;
        let pid = head.split_once('(')?.0.trim().parse().ok()?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // `f[0]` is field 3; field n is `f[n - 3]`.
        Some(Self {
            pid,
            state: f.first()?.chars().next()?,
            pgid: f.get(2)?.parse().ok()?,
            session: f.get(3)?.parse().ok()?,
            start: f.get(19)?.parse().ok()?,
        })
    }

    /// Reads `/proc/<pid>/stat`; `None` when there is no such process.
    pub fn read(pid: u32) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    fn is_zombie(&self) -> bool {
        self.state == 'Z'
    }
}

/// What to do with a recorded group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Still ours and still running: kill it.
    Kill,
    /// Nothing of it runs any more (or the pid is someone else's now): forget it.
    Gone(&'static str),
}

/// Decides whether `rec` still names a running group of the previous coordinator, given
/// this boot's id, what `/proc` shows for the leader's pid (a zombie included), and the
/// live (non-zombie) processes whose group id is `rec.pgid`.
pub fn verdict(
    rec: &GroupRecord,
    boot_id: &str,
    leader: Option<&ProcStat>,
    members: &[ProcStat],
) -> Verdict {
    if rec.boot_id != boot_id {
        return Verdict::Gone("the machine rebooted since");
    }
    if members.is_empty() {
        return Verdict::Gone("no process of it is left");
    }
    match leader {
        Some(l) if l.start == rec.leader_start && l.pgid == rec.pgid => Verdict::Kill,
        Some(_) => Verdict::Gone("its pid now belongs to another process"),
        // Every member of a group shares one session; group and session numbers cannot be
        // reused while they have members, so these are the dead leader's descendants.
        None if members.iter().all(|m| m.session == rec.session) => Verdict::Kill,
        None => Verdict::Gone("its group number now belongs to another session"),
    }
}

/// This machine's boot id (empty when unreadable: then nothing recorded is ever killed).
pub fn boot_id() -> String {
    std::fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Live processes in group `pgid`, from a scan of `/proc`.
fn members_of(pgid: u32) -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(ProcStat::read)
        .filter(|p| p.pgid == pgid && !p.is_zombie())
        .collect()
}

/// Writes and removes the group records of one entry's commands.
#[derive(Clone)]
pub struct GroupLedger {
    store: Store,
    clock: Arc<dyn Clock>,
    entry: u64,
}

impl std::fmt::Debug for GroupLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLedger")
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

impl GroupLedger {
    /// A ledger for the commands of entry `entry`.
    pub fn new(store: Store, clock: Arc<dyn Clock>, entry: u64) -> Self {
        Self {
            store,
            clock,
            entry,
        }
    }

    /// Records the group led by `pid` (just spawned in its own group, not yet waited for,
    /// so its pid cannot have been reused). A failure is logged: the command runs anyway,
    /// with the parent-death signal as its only guard.
    pub async fn record(&self, pid: u32, argv: &[String]) {
        let Some(stat) = ProcStat::read(pid) else {
            tracing::warn!(
                pid,
                "cannot read the new command's /proc entry; its group is not recorded"
            );
            return;
        };
        let rec = GroupRecord {
            pgid: pid,
            entry: self.entry,
            leader_start: stat.start,
            session: stat.session,
            boot_id: boot_id(),
            command: argv.join(" "),
        };
        let r = self.store.record_group(rec, self.clock.now()).await;
        if let Err(e) = r {
            tracing::error!(pid, entry = self.entry, error = %e, "cannot record the command's process group; a coordinator crash now would leave it running");
        }
    }

    /// Removes the record of group `pgid` (the command ended or its group was killed).
    /// Runs from a destructor, so it is synchronous and only logs failures.
    pub fn forget(&self, pgid: u32) {
        if let Err(e) = self.store.forget_group(pgid) {
            tracing::warn!(pgid, error = %e, "cannot remove the command's group record; the next start will find it gone");
        }
    }
}

/// Kills the process groups a previous coordinator left running, records each kill in its
/// entry's history ("killed process group N left by the previous coordinator"), and clears
/// the records. Called once at start, before any entry resumes.
pub async fn reap_previous(
    store: &Store,
    clock: &dyn Clock,
    entries: &[Entry],
) -> Result<(), StoreError> {
    let records = store.groups().await?;
    if records.is_empty() {
        return Ok(());
    }
    let by_index: BTreeMap<u64, &Entry> = entries.iter().map(|e| (e.index, e)).collect();
    let boot = boot_id();
    let mut writes = Vec::new();
    for rec in &records {
        let leader = ProcStat::read(rec.pgid);
        let members = members_of(rec.pgid);
        match verdict(rec, &boot, leader.as_ref(), &members) {
            Verdict::Gone(why) => {
                tracing::debug!(
                    pgid = rec.pgid,
                    entry = rec.entry,
                    why,
                    "recorded command group is gone"
                );
            }
            Verdict::Kill => {
                let killed = kill_and_wait(rec.pgid).await;
                let detail = format!(
                    "killed process group {} left by the previous coordinator ({}){}",
                    rec.pgid,
                    rec.command,
                    if killed {
                        ""
                    } else {
                        "; some of it still ran after 5 s"
                    }
                );
                tracing::warn!(pgid = rec.pgid, entry = rec.entry, command = %rec.command, killed, "{detail}");
                if let Some(e) = by_index.get(&rec.entry) {
                    writes.push(Write::History(
                        (*e).clone(),
                        HistoryEvent::new("orphan-killed", detail),
                    ));
                }
            }
        }
    }
    let now = clock.now();
    store.reaped(writes, now).await?;
    Ok(())
}

/// SIGKILL to the group, then waits until none of it is alive; `false` if some still was
/// after [`KILL_WAIT`].
async fn kill_and_wait(pgid: u32) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let alive = tokio::task::spawn_blocking(move || !members_of(pgid).is_empty())
            .await
            .unwrap_or(true);
        if !alive {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use crate::repair::store::RepairQueueStore;
    use std::os::unix::process::CommandExt;

    use super::*;
    use crate::clock::SystemClock;
    use jiff::Timestamp;

    fn rec() -> GroupRecord {
        GroupRecord {
            pgid: 4242,
            entry: 7,
            leader_start: 1000,
            session: 77,
            boot_id: "boot-a".into(),
            command: "sh -c sleep".into(),
        }
    }

    fn stat(pid: u32, pgid: u32, session: u32, start: u64) -> ProcStat {
        ProcStat {
            pid,
            state: 'S',
            pgid,
            session,
            start,
        }
    }

    #[test]
    fn parses_stat_with_a_hostile_command_name() {
        let text = "4242 (we ird) (x) S 1 4242 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 2000000 300 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = ProcStat::parse(text).unwrap();
        assert_eq!(s, stat(4242, 4242, 77, 123456));
        assert_eq!(ProcStat::parse("garbage"), None);
    }

    #[test]
    fn reads_its_own_stat() {
        let me = ProcStat::read(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(me.start > 0);
    }

    #[test]
    fn a_live_leader_with_the_recorded_start_time_is_killed() {
        let leader = stat(4242, 4242, 77, 1000);
        assert_eq!(
            verdict(&rec(), "boot-a", Some(&leader), &[leader]),
            Verdict::Kill
        );
    }

    #[test]
    fn a_recycled_pid_is_never_killed() {
        let stranger = stat(4242, 4242, 90, 5000);
        assert!(matches!(
            verdict(&rec(), "boot-a", Some(&stranger), &[stranger]),
            Verdict::Gone(_)
        ));
        let same_start_other_group = stat(4242, 1, 77, 1000);
        assert!(matches!(
            verdict(&rec(), "boot-a", Some(&same_start_other_group), &[]),
            Verdict::Gone(_)
        ));
    }

    #[test]
    fn survivors_of_a_dead_leader_in_the_recorded_session_are_killed() {
        let child = stat(4250, 4242, 77, 1010);
        assert_eq!(verdict(&rec(), "boot-a", None, &[child]), Verdict::Kill);
        let foreign = stat(4250, 4242, 90, 9000);
        assert!(matches!(
            verdict(&rec(), "boot-a", None, &[foreign]),
            Verdict::Gone(_)
        ));
        assert!(matches!(
            verdict(&rec(), "boot-a", None, &[]),
            Verdict::Gone(_)
        ));
    }

    #[test]
    fn a_dead_group_is_forgotten_even_with_its_zombie_leader() {
        let zombie = ProcStat {
            state: 'Z',
            ..stat(4242, 4242, 77, 1000)
        };
        assert!(matches!(
            verdict(&rec(), "boot-a", Some(&zombie), &[]),
            Verdict::Gone(_)
        ));
        let child = stat(4250, 4242, 77, 1010);
        assert_eq!(
            verdict(&rec(), "boot-a", Some(&zombie), &[child]),
            Verdict::Kill
        );
    }

    #[test]
    fn records_from_another_boot_are_forgotten() {
        let leader = stat(4242, 4242, 77, 1000);
        assert!(matches!(
            verdict(&rec(), "boot-b", Some(&leader), &[leader]),
            Verdict::Gone(_)
        ));
    }

    /// SIGKILLs a test's process group when dropped (also on a failed assertion).
    struct KillGroupOnDrop(u32);

    impl Drop for KillGroupOnDrop {
        fn drop(&mut self) {
            if let Ok(raw) = i32::try_from(self.0) {
                let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
            }
        }
    }

    /// The child's exit status, or `None` if it is still running after `limit`.
    async fn wait_bounded(
        child: &mut std::process::Child,
        limit: Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().ok().flatten() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn reap_kills_a_recorded_group_and_writes_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let e = Entry::new_queued("10.0.0.1", "", "qemu", "op", now);
        let ids = store
            .commit(
                vec![Write::Insert(e.clone(), HistoryEvent::new("added", ""))],
                now,
            )
            .await
            .unwrap();
        let mut e = e;
        e.index = ids[0];
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 300 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        // Whatever happens below, the group does not outlive the test.
        let _group = KillGroupOnDrop(pid);
        // Let sh fork its sleep.
        tokio::time::sleep(Duration::from_millis(200)).await;
        GroupLedger::new(store.clone(), Arc::new(SystemClock), e.index)
            .record(pid, &["sh".into(), "-c".into(), "sleep 300 & wait".into()])
            .await;
        reap_previous(&store, &SystemClock, std::slice::from_ref(&e))
            .await
            .unwrap();
        // Bounded: the group surviving the reap fails the test now, not when its sleep
        // ends five minutes later.
        let status = wait_bounded(&mut child, Duration::from_secs(10))
            .await
            .expect("the recorded group was not killed within 10 s");
        assert!(!status.success(), "killed: {status}");
        assert!(members_of(pid).is_empty(), "the sleep died with its group");
        let history = store.history(e.index).await.unwrap();
        let last = history.last().unwrap();
        assert_eq!(last.event, "orphan-killed");
        assert!(
            last.detail.contains(&format!(
                "killed process group {pid} left by the previous coordinator"
            )),
            "{}",
            last.detail
        );
        let left: i64 = store
            .with(|c| {
                c.query_row("SELECT count(*) FROM repair_command_groups", [], |r| {
                    r.get(0)
                })
            })
            .unwrap();
        assert_eq!(left, 0);
    }
}
