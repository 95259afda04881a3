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
//!
//! By job: [`fit`] (whether the files fit together; the start logs its failures too),
//! `store` (the database, and what the files would change in it, on a copy), `peers` (the
//! gateways, sabakan and the kubeconfig) and `served` (the machines each gateway serves).

use std::path::Path;

use protocol::Role;
use protocol::transport::{TlsFiles, TlsMaterial};

use crate::config::Config;
use crate::inventory::{RecordSource, load_inventory};

pub mod fit;
mod peers;
mod served;
mod store;
use fit::{power_coverage, remediation_coverage};
use peers::{check_gateways, check_kubeconfig, check_sabakan};
use store::{DbCopy, check_database, inventory_against_store, repair_against_store};

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

/// The `database` line: the SQLite file's checks, or for etcd a connection and its schema
/// ([`store::check_etcd`]).
fn check_store(config: &Config, copy: &DbCopy) -> Result<String, String> {
    match config.store.backend {
        crate::store::config::Backend::Sqlite => check_database(&config.database, copy),
        crate::store::config::Backend::Etcd => store::check_etcd(&config.store),
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
            "{}: listen {}, http {}, {}",
            config_path.display(),
            config.listen,
            protocol::telemetry::OrNone(&config.http.listen),
            match config.store.backend {
                crate::store::config::Backend::Sqlite =>
                    format!("database {}", config.database.display()),
                // `database` is not read on etcd; the `database` line names the endpoints.
                crate::store::config::Backend::Etcd => format!(
                    "store on etcd; several coordinators elect a leader (lease TTL {}, advertised as {})",
                    protocol::duration::display(config.ha.lease_ttl),
                    config.ha.advertised(config.listen)
                ),
            }
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
    out.push(line("database", check_store(&config, &copy)));
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
    fn a_missing_config_is_one_failed_line() {
        let lines = check(Path::new("/nonexistent/coordinator.toml"));
        assert_eq!(lines.len(), 1);
        assert!(!lines[0].ok);
        assert!(render(&lines).contains("FAIL"));
    }

    #[test]
    fn a_store_the_start_could_not_open_fails_the_database_line_as_the_start_would() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let base = format!(
            "listen = \"127.0.0.1:7443\"\ndatabase = \"{}\"\n[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n",
            db.display()
        );
        let database_line = |extra: &str| {
            let path = dir.path().join("c.toml");
            std::fs::write(&path, format!("{base}{extra}")).unwrap();
            let lines = check(&path);
            let l = lines
                .iter()
                .find(|l| l.what == "database")
                .expect("a database line")
                .clone();
            (l.ok, l.detail)
        };
        let (ok, detail) = database_line("");
        assert!(ok, "{detail}");
        assert!(detail.contains("will be created"), "{detail}");
        // An etcd nothing answers at: the line names the endpoint, as the start would.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (ok, detail) = database_line(&format!(
            "[store]\nbackend = \"etcd\"\nendpoints = [\"http://127.0.0.1:{port}\"]\n"
        ));
        assert!(!ok, "{detail}");
        assert!(
            detail.contains(&format!("http://127.0.0.1:{port}"))
                && detail.contains("cannot be reached"),
            "{detail}"
        );
        assert!(!db.exists(), "check creates nothing");
    }
}
