//! `coordinator check --config F`: loads and validates everything the coordinator would use
//! at start, without starting it, and says what it found.
//!
//! Checked: the configuration file; the TLS files (loadable, a coordinator certificate,
//! chaining to the CA, valid now); the inventory file; the repair (`repair:` YAML) file; that
//! the database (or, for a new one, its directory) is writable; that a named kubeconfig is
//! readable and has the chosen context; and what the inventory file would change in an
//! existing database (machines new, retired, hostnames moved, or a conflict that would stop
//! the start), found by importing it into a copy of the database taken as `coordinator
//! backup` takes one; and, on such a copy, that every active repair queue entry still has
//! its procedure in the repair file; and that the files fit together: power steps have a
//! gateway for each inventory machine they would run on, and every operation remediation may
//! enqueue has a procedure. Nothing is bound, the database itself is neither changed
//! nor locked (a running coordinator is not disturbed) and nothing is contacted.

use std::path::Path;

use protocol::Role;
use protocol::transport::{TlsFiles, TlsMaterial};

use crate::config::Config;
use crate::inventory::{RecordSource, load_inventory};

mod peers;
mod served;
use peers::{check_gateways, check_kubeconfig, check_sabakan};

/// One line of the check's output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckLine {
    /// What was checked (`config`, `tls`, `inventory`, `repair`, `power`, `remediation`,
    /// `database`, `kubernetes`).
    pub what: &'static str,
    /// Whether it is usable.
    pub ok: bool,
    /// What was found, or what is wrong.
    pub detail: String,
}

fn line(what: &'static str, r: Result<String, String>) -> CheckLine {
    match r {
        Ok(detail) => CheckLine {
            what,
            ok: true,
            detail,
        },
        Err(detail) => CheckLine {
            what,
            ok: false,
            detail,
        },
    }
}

/// Runs every check; a configuration that does not load is one failed line.
pub fn check(config_path: &Path) -> Vec<CheckLine> {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => return vec![line("config", Err(e.to_string()))],
    };
    let mut out = vec![line(
        "config",
        Ok(format!(
            "{}: listen {}, http {}, database {}",
            config_path.display(),
            config.listen,
            protocol::telemetry::OrNone(&config.http.listen),
            config.database.display()
        )),
    )];
    out.push(line("tls", check_tls(&config)));
    // Taken whenever there is a database: the `database` line reads the copy too (whether it
    // is a Fleetmend store this coordinator can open), as the file itself is not touched.
    let copy = DbCopy::take(&config.database);
    let mut machines = None;
    if let Some(path) = &config.inventory {
        let loaded = load_inventory(path, RecordSource::Inventory);
        let ok = loaded.is_ok();
        machines = loaded.as_ref().ok().cloned();
        out.push(line(
            "inventory",
            loaded
                .map(|r| {
                    let s = if r.len() == 1 { "" } else { "s" };
                    format!("{}: {} machine{s}", path.display(), r.len())
                })
                .map_err(|e| e.to_string()),
        ));
        if ok && let Some(r) = inventory_against_store(&config, &copy, path) {
            out.push(line("inventory", r));
        }
    }
    let mut procedures = None;
    if let Some(path) = config.repair.as_ref().and_then(|r| r.config.as_deref()) {
        let loaded = crate::repair::load::load_file(path);
        procedures = loaded.as_ref().ok().map(|l| l.config.clone());
        out.push(line(
            "repair",
            loaded
                .map(|l| {
                    let n = l.config.repair_procedures.len();
                    let s = if n == 1 { "" } else { "s" };
                    let mut d = format!("{}: {n} procedure{s}", path.display());
                    for w in &l.warnings {
                        d.push_str("; warning: ");
                        d.push_str(w);
                    }
                    d
                })
                .map_err(|e| e.to_string()),
        ));
        if let Some(procedures) = &procedures
            && let Some(r) = repair_against_store(&config.database, &copy, procedures)
        {
            out.push(line("repair", r));
        }
        if let Some(procedures) = &procedures
            && let Some(r) = power_coverage(&config, procedures, machines.as_deref())
        {
            out.push(line("power", r));
        }
        if let (Some(procedures), Some(machines), Some(rem)) =
            (&procedures, &machines, &config.remediation)
        {
            out.push(line(
                "remediation",
                remediation_coverage(rem, procedures, machines),
            ));
        }
    }
    out.push(line("database", check_database(&config.database, &copy)));
    let mut served = std::collections::BTreeMap::new();
    for g in check_gateways(&config) {
        out.push(line("gateway", g.line));
        if let Some(m) = g.served {
            served.insert(g.name, m);
        }
    }
    if let (Some(procedures), Some(machines)) = (&procedures, &machines)
        && let Some(r) = served::power_served(&config, procedures, machines, &served)
    {
        out.push(line("power", r));
    }
    if let Some(k) = &config.kubernetes {
        out.push(line("kubernetes", check_kubeconfig(k)));
    }
    if let Some(rem) = &config.remediation
        && let Some(r) = check_sabakan(rem)
    {
        out.push(line("sabakan", r));
    }
    out
}

/// The fit checks' failures (`power`, `remediation`), for the log at start: a coordinator
/// started without `coordinator check` still says which repairs cannot run. Takes what the
/// start has loaded already.
pub fn unfit(
    config: &Config,
    procedures: &crate::repair::RepairConfig,
    machines: Option<&[crate::inventory::MachineRecord]>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(Err(e)) = power_coverage(config, procedures, machines) {
        out.push(e);
    }
    if let (Some(m), Some(rem)) = (machines, &config.remediation)
        && let Err(e) = remediation_coverage(rem, procedures, m)
    {
        out.push(e);
    }
    out
}

/// The power built-ins (`@power-cycle`, `@fence`, …) the repair file's steps use, and the
/// machine types of the procedures that use them.
fn power_steps(
    procedures: &crate::repair::RepairConfig,
) -> (
    std::collections::BTreeSet<&'static str>,
    std::collections::BTreeSet<&str>,
) {
    let mut steps = std::collections::BTreeSet::new();
    let mut types = std::collections::BTreeSet::new();
    for p in &procedures.repair_procedures {
        for op in &p.repair_operations {
            for s in &op.repair_steps {
                if let Some(b) = s.repair_command.power_builtin() {
                    steps.insert(b.name());
                    types.extend(p.machine_types.iter().map(String::as_str));
                }
            }
        }
    }
    (steps, types)
}

/// Whether the repair file's power steps (`@power-cycle`, `@fence`, …) have a gateway to go
/// through: without one such a step fails at once ("power control not available"), which
/// nothing at start would say. `None` when no step is a power step. With an inventory file,
/// each of its machines whose type has a power step must be served by a gateway (by address
/// or rack); without one, only that some gateway is configured can be checked.
fn power_coverage(
    config: &Config,
    procedures: &crate::repair::RepairConfig,
    machines: Option<&[crate::inventory::MachineRecord]>,
) -> Option<Result<String, String>> {
    let (steps, types) = power_steps(procedures);
    if steps.is_empty() {
        return None;
    }
    let steps = steps.into_iter().collect::<Vec<_>>().join(", ");
    let types_list = types.iter().copied().collect::<Vec<_>>().join(", ");
    let targets = config
        .gateways
        .as_ref()
        .map(|g| g.targets.as_slice())
        .unwrap_or_default();
    let Some(machines) = machines else {
        return Some(if targets.is_empty() {
            Err(format!(
                "the repair file has power steps ({steps}, machine types {types_list}) but no \
                 [[gateways.targets]] is configured: every such step would fail"
            ))
        } else {
            Ok(format!(
                "power steps ({steps}) go through {} gateway(s); no inventory file to check \
                 each machine against",
                targets.len()
            ))
        });
    };
    let concerned: Vec<_> = machines
        .iter()
        .filter(|m| m.machine_type.as_deref().is_some_and(|t| types.contains(t)))
        .collect();
    if concerned.is_empty() {
        return Some(Ok(format!(
            "power steps ({steps}) are for machine types ({types_list}) no machine in the \
             inventory has"
        )));
    }
    if targets.is_empty() {
        return Some(Err(format!(
            "the repair file has power steps ({steps}) for {} machine{} (types {types_list}) but \
             no [[gateways.targets]] is configured: every such step would fail",
            concerned.len(),
            if concerned.len() == 1 { "" } else { "s" }
        )));
    }
    let unserved: Vec<String> = concerned
        .iter()
        .filter(|m| {
            crate::gateway::serving(targets, &m.address, || {
                (!m.rack.is_empty()).then(|| m.rack.clone())
            })
            .is_none()
        })
        .map(|m| {
            if m.rack.is_empty() {
                format!("{} (no rack)", m.address)
            } else {
                format!("{} (rack {})", m.address, m.rack)
            }
        })
        .collect();
    Some(if unserved.is_empty() {
        Ok(format!(
            "power steps ({steps}): each of the {} machines of types {types_list} has a gateway",
            concerned.len()
        ))
    } else {
        let shown = unserved
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = unserved.len().saturating_sub(5);
        Err(format!(
            "{} of {} machines whose repairs have power steps ({steps}) have no gateway serving \
             their address or rack, so those steps would fail: {shown}{}; add the rack to a \
             [[gateways.targets]] racks list",
            unserved.len(),
            concerned.len(),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ))
    })
}

/// Whether every operation automatic remediation may enqueue for an inventory machine has a
/// procedure for the machine's type: auto-repair enqueues the machine's state (`unhealthy`,
/// `unreachable`) for the machines its `having` / `not_having` filters let through, and each
/// health check its `operation` for the machines it selects. A missing one is refused at
/// enqueue time, so the machine is never repaired by itself; this says so before.
fn remediation_coverage(
    rem: &crate::remediation::RemediationConfig,
    procedures: &crate::repair::RepairConfig,
    machines: &[crate::inventory::MachineRecord],
) -> Result<String, String> {
    use std::collections::{BTreeMap, BTreeSet};
    // (machine type, operation) → machines that would need it.
    let mut needed: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in machines {
        let Some(t) = &r.machine_type else { continue };
        let m = as_remediation_machine(r);
        let ar = &rem.auto_repair;
        if ar.enabled && ar.source == crate::remediation::sabakan::Source::Inventory {
            for state in &ar.having.states {
                let mut m = m.clone();
                m.state = *state;
                if ar.having.matches_all(&m) && !ar.not_having.matches_any(&m) {
                    needed
                        .entry((t.clone(), state.as_str().to_string()))
                        .or_default()
                        .insert(r.address.clone());
                    // An unhealthy machine's operation may come from its failing check.
                    if *state == crate::health::MachineState::Unhealthy {
                        for o in &ar.operation_by_check {
                            needed
                                .entry((t.clone(), o.operation.clone()))
                                .or_default()
                                .insert(r.address.clone());
                        }
                    }
                }
            }
        }
        for hc in &rem.health_checks {
            if hc.selector.matches(&m) {
                needed
                    .entry((t.clone(), hc.operation.clone()))
                    .or_default()
                    .insert(r.address.clone());
            }
        }
    }
    let missing: Vec<String> = needed
        .iter()
        .filter(|((t, op), _)| procedures.operation_for(t, op).is_err())
        .map(|((t, op), who)| {
            let n = who.len();
            let first = who.iter().next().map(String::as_str).unwrap_or_default();
            format!(
                "`{op}` for type {t} ({n} machine{}, e.g. {first})",
                if n == 1 { "" } else { "s" }
            )
        })
        .collect();
    let ar = &rem.auto_repair;
    // With sabakan, which states machines may be in is sabakan's answer at each pass: the
    // auto-repair operations are checked then (held `enqueue-refused` when a procedure is
    // missing), not here.
    let from_sabakan = if ar.enabled && ar.source == crate::remediation::sabakan::Source::Sabakan {
        "; auto-repair's operations come from sabakan's states and are checked at each pass"
    } else {
        ""
    };
    if missing.is_empty() {
        let n = needed.len();
        Ok(format!(
            "each operation remediation may enqueue has a procedure ({n} type/operation pair{}){from_sabakan}",
            if n == 1 { "" } else { "s" }
        ))
    } else {
        Err(format!(
            "remediation would enqueue operations the repair file has no procedure for, so \
             those machines are never repaired by themselves: {}",
            missing.join(", ")
        ))
    }
}

/// An inventory record as the remediation filters see a machine (state set by the caller).
fn as_remediation_machine(r: &crate::inventory::MachineRecord) -> crate::remediation::Machine {
    crate::remediation::Machine {
        serial: r.serial.clone(),
        rack: r.rack.clone(),
        role: r.role.clone(),
        machine_type: r.machine_type.clone(),
        labels: r.labels.clone(),
        ..crate::remediation::Machine::unreported(
            &r.address,
            crate::health::MachineState::Healthy,
            jiff::Timestamp::UNIX_EPOCH,
        )
    }
}

/// A copy of the database for the comparisons, taken once per check as `coordinator backup`
/// takes one (the database itself is neither changed nor locked).
/// The name of the directories the copies are taken into start with this.
const COPY_PREFIX: &str = "fleetmend-check-";

/// A check killed before it could remove its copy (`kill -9`, a crash) leaves it behind;
/// the next check removes such copies once they are an hour old (a check takes seconds).
fn remove_stale_copies(tmp: &Path, now: std::time::SystemTime) {
    let Ok(dir) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in dir.flatten() {
        let stale = e.file_name().to_string_lossy().starts_with(COPY_PREFIX)
            && e.metadata().is_ok_and(|m| {
                m.is_dir()
                    && m.modified().is_ok_and(|t| {
                        now.duration_since(t)
                            .is_ok_and(|age| age > std::time::Duration::from_secs(3600))
                    })
            });
        if stale {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

enum DbCopy {
    /// No database yet: nothing to compare with.
    None,
    /// The copy, removed with its directory when dropped.
    Taken(tempfile::TempDir),
    /// Not taken because this user does not own the database: no fault of the files, so the
    /// comparisons say how to make them and do not fail.
    NotOwner(String),
    /// Not taken: the comparisons fail with this.
    Failed(String),
}

impl DbCopy {
    fn take(db: &Path) -> Self {
        // A coordinator that holds this file under another name (a hard link or symlink)
        // keeps its newest writes in that name's `-wal`, which a copy through this name
        // does not read ("no such table"): say what the coordinator would say at start.
        if let Err(e) = crate::store::lock::held_under_another_name(db) {
            return Self::Failed(e.to_string());
        }
        // An empty file is a store not yet initialised (created, then migrated at start).
        if std::fs::metadata(db).map_or(true, |m| m.len() == 0) {
            return Self::None;
        }
        let tmp = std::env::temp_dir();
        remove_stale_copies(&tmp, std::time::SystemTime::now());
        let dir = match tempfile::Builder::new()
            .prefix(COPY_PREFIX)
            .tempdir_in(&tmp)
        {
            Ok(d) => d,
            Err(e) => return Self::Failed(e.to_string()),
        };
        match crate::store::backup::backup(db, &dir.path().join("copy.db")) {
            Ok(_) => Self::Taken(dir),
            Err(e @ crate::store::backup::BackupError::NotOwner { .. }) => {
                Self::NotOwner(e.to_string())
            }
            Err(e) => Self::Failed(e.to_string()),
        }
    }

    /// The copy's path, or the line to print instead of comparing with `what`; `None` when
    /// there is no database.
    fn path(&self, what: &str) -> Option<Result<std::path::PathBuf, Result<String, String>>> {
        match self {
            Self::None => None,
            Self::Taken(dir) => Some(Ok(dir.path().join("copy.db"))),
            Self::NotOwner(e) => Some(Err(Ok(format!("not compared with {what}: {e}")))),
            Self::Failed(e) => Some(Err(Err(format!("cannot compare with {what}: {e}")))),
        }
    }
}

/// Whether every queued or processing repair queue entry in the database still has its
/// procedure in the repair file: at start, one that has none fails. `None` when no entry is
/// active. Read from a copy of the database, as for the inventory.
fn repair_against_store(
    db: &Path,
    copy: &DbCopy,
    procedures: &crate::repair::RepairConfig,
) -> Option<Result<String, String>> {
    let copy = match copy.path("the repair queue")? {
        Ok(p) => p,
        Err(line) => return Some(line),
    };
    // A copy of the SQLite file: read with the SQLite backend's own functions.
    let loaded = crate::store::Sqlite::open(&copy)
        .and_then(|s| s.with(|c| crate::repair::store::sqlite::load(c)));
    let entries = match loaded {
        Ok((_, entries)) => entries,
        Err(e) => {
            return Some(Err(format!(
                "cannot compare the file with the repair queue's entries: {e}"
            )));
        }
    };
    let active: Vec<_> = entries
        .iter()
        .filter(|e| e.is_active() && !e.deleted)
        .collect();
    if active.is_empty() {
        return None;
    }
    let orphans: Vec<String> = active
        .iter()
        .filter(|e| {
            procedures
                .operation_for(&e.machine_type, &e.operation)
                .is_err()
        })
        .map(|e| {
            format!(
                "#{} ({} {} {}, {})",
                e.index,
                e.operation,
                e.machine_type,
                e.address,
                e.status.as_str()
            )
        })
        .collect();
    let db = db.display();
    Some(match (orphans.len(), active.len()) {
        (0, 1) => Ok(format!(
            "against {db}: the one queued or processing entry has its procedure in this file"
        )),
        (0, n) => Ok(format!(
            "against {db}: the {n} queued or processing entries have their procedures in this file"
        )),
        (n, _) => Err(format!(
            "against {db}: {} {} no procedure in this file and would fail at the start; keep \
             the procedure until it finishes (`coordinatorctl repair-queue wait`), or delete the \
             entry first (`coordinatorctl repair-queue delete INDEX`)",
            if n == 1 { "entry" } else { "entries" },
            orphans.join(", ") + if n == 1 { " has" } else { " have" },
        )),
    })
}

/// What importing the inventory file would change in the database, found on a copy of it.
fn inventory_against_store(
    config: &Config,
    copy: &DbCopy,
    path: &Path,
) -> Option<Result<String, String>> {
    let copy = match copy.path("the database")? {
        Ok(p) => p,
        Err(line) => return Some(line),
    };
    Some(import_into_copy(config, &copy, path))
}

/// Imports the inventory file at `path` into the database copy at `copy`.
fn import_into_copy(config: &Config, copy: &Path, path: &Path) -> Result<String, String> {
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot compare the file with the database: {e}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| cannot(&e))?;
    let import = rt.block_on(async {
        let store = crate::store::Store::open(copy).map_err(|e| cannot(&e))?;
        let fleet = crate::fleet::Fleet::open(
            store.clone(),
            std::sync::Arc::new(crate::clock::SystemClock),
            config.health.resolved(),
        )
        .await
        .map_err(|e| cannot(&e))?;
        crate::app::import_inventory(&fleet, &store, path)
            .await
            .map_err(|e| format!("the coordinator would not start: {e}"))
    })?;
    Ok(describe_import(&config.database, &import))
}

/// `import` as one line: what a start with this file would change.
fn describe_import(db: &Path, import: &crate::app::InventoryImport) -> String {
    let list = |v: &[String]| v.join(", ");
    let mut parts = Vec::new();
    let new: Vec<String> = import
        .new
        .iter()
        .filter(|a| !import.moved.iter().any(|(_, _, to)| to == *a))
        .cloned()
        .collect();
    if !new.is_empty() {
        parts.push(format!("new: {}", list(&new)));
    }
    for (hostname, from, to) in &import.moved {
        parts.push(format!(
            "{hostname} moves from {from} to {to} (the retired record at {from} is deleted, its history kept)"
        ));
    }
    if !import.released.is_empty() {
        parts.push(format!(
            "no longer listed, to be retired and left to `coordinatorctl machines delete`: {}",
            list(&import.released)
        ));
    }
    if !import.deferred.is_empty() {
        parts.push(format!(
            "left out of the start while the machine holding their hostname is under repair: {}",
            list(&import.deferred)
        ));
    }
    if parts.is_empty() {
        format!("against {}: no change to the machines", db.display())
    } else {
        format!("against {}: {}", db.display(), parts.join("; "))
    }
}

fn check_tls(config: &Config) -> Result<String, String> {
    let tls = TlsMaterial::load(&TlsFiles {
        ca: config.tls.ca.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    })
    .map_err(|e| e.to_string())?;
    let me = tls.identity();
    if me.role != Role::Coordinator {
        return Err(format!(
            "{} names {me}, not a coordinator; issue one with `coordinatorctl pki issue --role coordinator`",
            config.tls.cert.display()
        ));
    }
    tls.check_own_chain(&config.tls.cert, &config.tls.ca, "tls.ca")
        .map_err(|e| e.to_string())?;
    let when = tls.expiry().summary(
        protocol::transport::unix_now(),
        "`coordinatorctl pki issue --role coordinator`, then `systemctl reload coordinator`",
    );
    Ok(format!(
        "{me} ({}), chains to {}; {when}",
        config.tls.cert.display(),
        config.tls.ca.display(),
    ))
}

/// Writable without opening SQLite: an existing file opened for writing, or a new file
/// creatable in its directory (created and removed again).
fn check_database(db: &Path, copy: &DbCopy) -> Result<String, String> {
    if db.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(db)
            .map_err(|e| format!("{}: not writable: {e}", db.display()))?;
        // The copy failed on what the file holds (not SQLite, another program's, newer), or
        // could not be taken as this user (then only writability is known).
        match copy {
            DbCopy::Failed(e) => Err(e.clone()),
            DbCopy::NotOwner(_) => Ok(format!(
                "{}: exists, writable (contents not read: not its owner)",
                db.display()
            )),
            DbCopy::Taken(_) | DbCopy::None => Ok(format!("{}: exists, writable", db.display())),
        }
    } else {
        let dir = match db.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let probe = dir.join(format!(".fleetmend-check-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map(|_| {
                let _ = std::fs::remove_file(&probe);
                format!("{}: will be created (directory writable)", db.display())
            })
            .map_err(|e| {
                format!(
                    "{}: cannot be created in {}: {e}",
                    db.display(),
                    dir.display()
                )
            })
    }
}

/// The lines as a table for a person.
pub fn render(lines: &[CheckLine]) -> String {
    let mut s = String::new();
    for l in lines {
        s.push_str(&format!(
            "{:<13}{:<6}{}\n",
            l.what,
            if l.ok { "ok" } else { "FAIL" },
            l.detail
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_left_by_a_killed_check_are_removed_once_old() {
        let tmp = tempfile::tempdir().unwrap();
        let left = tmp.path().join(format!("{COPY_PREFIX}abc"));
        let other = tmp.path().join("someone-else");
        for d in [&left, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("copy.db"), b"x").unwrap();
        }
        let now = std::time::SystemTime::now();
        remove_stale_copies(tmp.path(), now);
        assert!(
            left.exists(),
            "a copy of a check that may still run is kept"
        );
        remove_stale_copies(tmp.path(), now + std::time::Duration::from_secs(3601));
        assert!(!left.exists(), "an hour-old copy is removed");
        assert!(other.exists(), "only the check's own copies are touched");
    }

    #[test]
    fn an_import_is_described_without_repeating_a_move_as_new_or_retired() {
        let db = Path::new("/var/lib/c.db");
        let none = crate::app::InventoryImport::default();
        assert_eq!(
            describe_import(db, &none),
            "against /var/lib/c.db: no change to the machines"
        );
        let import = crate::app::InventoryImport {
            new: vec!["10.0.0.3".into(), "10.0.0.9".into()],
            released: vec!["10.0.0.2".into()],
            moved: vec![("web-1".into(), "10.0.0.1".into(), "10.0.0.9".into())],
            deferred: vec![],
            records: vec![],
        };
        assert_eq!(
            describe_import(db, &import),
            "against /var/lib/c.db: new: 10.0.0.3; web-1 moves from 10.0.0.1 to 10.0.0.9 (the \
             retired record at 10.0.0.1 is deleted, its history kept); no longer listed, to be \
             retired and left to `coordinatorctl machines delete`: 10.0.0.2"
        );
    }

    #[test]
    fn a_missing_config_is_one_failed_line() {
        let lines = check(Path::new("/nonexistent/coordinator.toml"));
        assert_eq!(lines.len(), 1);
        assert!(!lines[0].ok);
        assert!(render(&lines).contains("FAIL"));
    }

    #[test]
    fn a_database_a_coordinator_holds_under_another_name_is_named_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        drop(crate::store::Store::open(&db).unwrap());
        // As a running coordinator holds it (here: this process).
        let _held = crate::store::lock::StoreLock::acquire(&db, false).unwrap();
        let hard = dir.path().join("hard.db");
        std::fs::hard_link(&db, &hard).unwrap();
        let copy = DbCopy::take(&hard);
        let e = check_database(&hard, &copy).unwrap_err();
        assert!(
            e.contains(&format!(
                "is in use by another coordinator (pid {}) that opened the same file under another name",
                std::process::id()
            )),
            "{e}"
        );
        let procedures = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: unhealthy\n      repair_steps:\n      - repair_command: [\"true\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let e = repair_against_store(&hard, &copy, &procedures)
            .expect("a line")
            .unwrap_err();
        assert!(
            e.contains("under another name") && !e.contains("no such table"),
            "{e}"
        );
        // Under the holder's own name the check reads its copy as ever.
        let copy = DbCopy::take(&db);
        assert!(check_database(&db, &copy).unwrap().contains("writable"));
    }

    #[test]
    fn database_checks_tell_writable_from_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let check = |p: &Path| check_database(p, &DbCopy::take(p));
        assert!(check(&db).unwrap().contains("will be created"));
        std::fs::write(&db, b"").unwrap();
        assert!(check(&db).unwrap().contains("writable"));
        drop(crate::store::Store::open(&db).unwrap());
        assert!(check(&db).unwrap().contains("writable"));
        assert!(check(Path::new("/nonexistent/dir/c.db")).is_err());
        // What the start would refuse, check refuses: not SQLite, another program's
        // tables, a newer schema.
        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x5a; 5000]).unwrap();
        let e = check(&garbage).unwrap_err();
        assert!(e.contains("not a database"), "{e}");
        let other = dir.path().join("other.db");
        rusqlite::Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE users(id INTEGER)")
            .unwrap();
        let e = check(&other).unwrap_err();
        assert!(e.contains("not a Fleetmend store"), "{e}");
        rusqlite::Connection::open(&db)
            .unwrap()
            .pragma_update(None, "user_version", 999)
            .unwrap();
        let e = check(&db).unwrap_err();
        assert!(e.contains("newer than this coordinator"), "{e}");
        assert!(e.contains("coordinator restore --from"), "{e}");
    }

    #[test]
    fn power_steps_need_a_gateway_for_every_machine_of_their_types() {
        let config = |gateways: &str| {
            let text = format!(
                "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\nca = \"a\"\n\
                 cert = \"b\"\nkey = \"c\"\n{gateways}"
            );
            Config::parse(&text, Path::new("c.toml")).unwrap()
        };
        let repair = |cmd: &str| {
            let yaml = format!(
                "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
                 - operation: op\n      repair_steps:\n      - repair_command: [{cmd}]\n      \
                 health_check_command: [\"@agent-healthy\"]\n"
            );
            crate::repair::load::load_str(&yaml, Path::new("r.yml"))
                .unwrap()
                .config
        };
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nrack = \"r1\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.2.1\"\nhostname = \"b\"\nrack = \"r2\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.3.1\"\nhostname = \"c\"\nrack = \"r3\"\nmachine_type = \"other\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        let target = |racks: &str, machines: &str| {
            format!(
                "[[gateways.targets]]\nname = \"g\"\naddress = \"127.0.0.1:1\"\nserver_name = \"g\"\n\
                 racks = [{racks}]\nmachines = [{machines}]\n"
            )
        };
        // No power step: nothing to say.
        assert!(power_coverage(&config(""), &repair("\"true\""), Some(&machines)).is_none());
        // Power steps and no gateway at all.
        let e = power_coverage(&config(""), &repair("\"@power-cycle\""), None)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("no [[gateways.targets]]"), "{e}");
        let e = power_coverage(&config(""), &repair("\"@fence\""), Some(&machines))
            .unwrap()
            .unwrap_err();
        assert!(
            e.contains("for 2 machines") && e.contains("no [[gateways.targets]]"),
            "{e}"
        );
        // One rack served, the other machine listed by address: all covered (the third
        // machine's type has no power step).
        let ok = power_coverage(
            &config(&target("\"r1\"", "\"10.0.2.1\"")),
            &repair("\"@power-cycle\""),
            Some(&machines),
        )
        .unwrap()
        .unwrap();
        assert!(ok.contains("each of the 2 machines"), "{ok}");
        let e = power_coverage(
            &config(&target("\"r1\"", "")),
            &repair("\"@power-cycle\""),
            Some(&machines),
        )
        .unwrap()
        .unwrap_err();
        assert!(
            e.contains("1 of 2") && e.contains("10.0.2.1 (rack r2)"),
            "{e}"
        );
    }

    #[test]
    fn remediation_needs_a_procedure_for_each_operation_it_may_enqueue() {
        let rem = |extra: &str| -> crate::remediation::RemediationConfig {
            toml::from_str(extra).unwrap()
        };
        let repair = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: unhealthy\n      repair_steps:\n      - repair_command: [\"true\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.1.2\"\nhostname = \"b\"\nrole = \"boot\"\nmachine_type = \"gpu\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        // Auto-repair's defaults: `unhealthy` and `unreachable`; the boot server (type gpu,
        // no procedure at all) is left alone by not_having, so only lab's gap is named.
        let e = remediation_coverage(&rem(""), &repair, &machines).unwrap_err();
        assert!(
            e.contains("`unreachable` for type lab (1 machine, e.g. 10.0.1.1)"),
            "{e}"
        );
        assert!(
            !e.contains("gpu") && !e.contains("`unhealthy` for type lab"),
            "{e}"
        );
        // An operation chosen by failing check needs its procedure too.
        let e = remediation_coverage(
            &rem("[auto_repair]\nhaving = { states = [\"unhealthy\"] }\n\
                 operation_by_check = [{ check = \"gpu\", operation = \"gpu-xid\" }]\n"),
            &repair,
            &machines,
        )
        .unwrap_err();
        assert!(
            e.contains("`gpu-xid` for type lab (1 machine, e.g. 10.0.1.1)"),
            "{e}"
        );
        // Only unhealthy machines, and a health check whose operation lab has.
        let ok = remediation_coverage(
            &rem(
                "[auto_repair.having]\nstates = [\"unhealthy\"]\n[[health_checks]]\nname = \"h\"\n\
                  selector = { machine_types = [\"lab\"] }\nunhealthy_conditions = [{ type = \"kubelet\", \
                  status = \"False\", timeout = \"1m\" }]\n",
            ),
            &repair,
            &machines,
        );
        assert!(ok.is_ok(), "{ok:?}");
        // Auto-repair off: nothing is needed from it.
        let ok = remediation_coverage(&rem("[auto_repair]\nenabled = false\n"), &repair, &machines);
        assert!(ok.is_ok(), "{ok:?}");
        // Reading sabakan: its states are sabakan's answer at each pass, which the line says
        // instead of a count of pairs it never looked at.
        let ok = remediation_coverage(
            &rem(
                "[auto_repair]\nsource = \"sabakan\"\nsabakan = { url = \"http://127.0.0.1:1/graphql\" }\n",
            ),
            &repair,
            &machines,
        )
        .unwrap();
        assert!(
            ok.contains("(0 type/operation pairs)")
                && ok.contains("auto-repair's operations come from sabakan's states"),
            "{ok}"
        );
    }

    #[test]
    fn the_fit_failures_are_listed_for_the_log_at_start() {
        let procedures = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: unhealthy\n      repair_steps:\n      - repair_command: [\"@power-cycle\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nrack = \"r1\"\nmachine_type = \"lab\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        let config = |extra: &str| {
            let text = format!(
                "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\n\
                 ca = \"a\"\ncert = \"b\"\nkey = \"c\"\n{extra}"
            );
            Config::parse(&text, Path::new("c.toml")).unwrap()
        };
        let found = unfit(&config("[remediation]\n"), &procedures, Some(&machines));
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].contains("no [[gateways.targets]]"), "{found:#?}");
        assert!(
            found[1].contains("`unreachable` for type lab"),
            "{found:#?}"
        );
        let served = "[[gateways.targets]]\nname = \"g\"\naddress = \"127.0.0.1:1\"\n\
                      server_name = \"g\"\nracks = [\"r1\"]\n";
        assert!(unfit(&config(served), &procedures, Some(&machines)).is_empty());
    }

    #[test]
    fn a_missing_kubeconfig_is_reported_as_missing() {
        let k: crate::k8s::KubernetesConfig =
            toml::from_str("kubeconfig = \"/nonexistent/kubeconfig\"").unwrap();
        let e = check_kubeconfig(&k).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
