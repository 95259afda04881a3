//! Issue 10, item 2's sabakan source end to end: a real coordinator process whose
//! auto-repair reads its machines from the test kit's fake sabakan (GraphQL
//! `searchMachines(having, notHaving)`) instead of the built-in inventory.
//!
//! One story, observed the way an operator would (`repair-queue list`, `events`,
//! `remediation status`, `/metrics`):
//! 1. sabakan reports one machine UNHEALTHY (plus a healthy one, an unhealthy boot server
//!    and a retiring one) → exactly one entry: address `spec.ipv4[0]`, machine type
//!    `spec.bmc.bmcType`, operation `unhealthy`, serial; asked with sabakan-shaped variables;
//! 2. sabakan answers with GraphQL errors → auto-repair holds with that reason, and an entry
//!    deleted meanwhile is not re-enqueued from the last good answer;
//! 3. sabakan answers again → the machine, still unhealthy, is enqueued afresh;
//! 4. sabakan is down (connection refused) → held with that reason.

use std::time::Duration;

use serde_json::{Value, json};
use testkit::ctl_json::{JournalLine, RemediationStatus};
use testkit::fake_sabakan::{FakeSabakan, Fault, SabakanMachine};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, wait_for};

/// Bound for anything a test causes (the machine is shared and loaded: generous).
const SETTLE: Duration = Duration::from_secs(60);

/// The repair procedure for sabakan's machine type; its health check never passes, so an
/// entry stays in flight for the whole test.
const REPAIR_YML: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["IPMI-2.0"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["true"]
              watch_seconds: 600
          health_check_command: ["sh", "-c", "echo false"]
"#;

struct Env {
    _tmp: tempfile::TempDir,
    coord: Coordinator,
}

impl Env {
    fn start(sabakan_url: &str) -> anyhow::Result<Self> {
        Self::start_with(sabakan_url, None)
    }

    /// With `ca_file`: the CA that sabakan's https certificate must chain to.
    fn start_with(sabakan_url: &str, ca_file: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
        let repair = dir.join("repair.yml");
        std::fs::write(&repair, REPAIR_YML)?;
        let extra = format!(
            "[repair]\nconfig = {:?}\n\n[remediation]\ninterval = \"500ms\"\n\n\
             [remediation.auto_repair]\nsource = \"sabakan\"\n\
             sabakan = {{ url = {sabakan_url:?}, timeout = \"2s\"{} }}\n",
            repair.display().to_string(),
            ca_file
                .map(|p| format!(", ca_file = {:?}", p.display().to_string()))
                .unwrap_or_default()
        );
        let coord = Coordinator::start(
            &dir.join("coord"),
            &pki,
            &CoordinatorOptions {
                report_interval: Duration::from_millis(300),
                unreachable_grace: Duration::from_millis(900),
                inventory: None,
                extra,
                health_extra: String::new(),
            },
        )?;
        Ok(Self { _tmp: tmp, coord })
    }

    fn entries(&self) -> anyhow::Result<Vec<Value>> {
        self.coord.ctl_json(&["repair-queue", "list", "--json"])
    }

    fn events(&self, machine: &str) -> anyhow::Result<Vec<JournalLine>> {
        self.coord
            .ctl_json(&["events", "--machine", machine, "--json"])
    }

    fn status(&self) -> anyhow::Result<RemediationStatus> {
        self.coord.ctl_json(&["remediation", "status", "--json"])
    }

    /// Waits for the line about sabakan whose sentence contains `text`, repeated at least
    /// `count` times (proof that that many passes ran since it was first made).
    fn wait_held(&self, text: &str, count: u64) -> anyhow::Result<JournalLine> {
        wait_for(&format!("sabakan held: {text} x{count}"), SETTLE, || {
            let lines = self.events("sabakan").map_err(|e| e.to_string())?;
            lines
                .iter()
                .rev()
                .find(|l| {
                    l.outcome == "held"
                        && l.rule == "sabakan-unavailable"
                        && l.sentence.contains(text)
                        && l.count >= count
                })
                .cloned()
                .ok_or_else(|| format!("{lines:#?}"))
        })
    }

    /// Waits until exactly one unfinished entry exists and returns it.
    fn wait_one_entry(&self) -> anyhow::Result<Value> {
        wait_for("one repair queue entry", SETTLE, || {
            let l = self.entries().map_err(|e| e.to_string())?;
            let active: Vec<_> = l
                .into_iter()
                .filter(|e| ["queued", "processing"].contains(&field(e, "status")))
                .collect();
            match active.as_slice() {
                [e] => Ok(e.clone()),
                other => Err(format!("{other:#?}")),
            }
        })
    }
}

fn field<'a>(e: &'a Value, k: &str) -> &'a str {
    e[k].as_str().unwrap_or_default()
}

#[test]
fn sabakans_unhealthy_machine_is_enqueued_and_an_unreadable_sabakan_holds_auto_repair()
-> anyhow::Result<()> {
    let mut sabakan = FakeSabakan::start(vec![
        SabakanMachine::new("SN-A", "10.0.2.1", 1),
        SabakanMachine::new("SN-B", "10.0.2.2", 1)
            .state("UNHEALTHY", Duration::from_secs(90))
            .label("product", "R640"),
        SabakanMachine::new("SN-C", "10.0.2.3", 2)
            .role("boot")
            .state("UNHEALTHY", Duration::from_secs(90)),
        SabakanMachine::new("SN-D", "10.0.2.4", 2).state("RETIRING", Duration::from_secs(90)),
    ])?;
    let env = Env::start(&sabakan.url())?;

    // 1. Exactly the expected entry.
    let e = env.wait_one_entry()?;
    assert_eq!(
        (
            field(&e, "address"),
            field(&e, "operation"),
            field(&e, "machine_type"),
            field(&e, "serial")
        ),
        ("10.0.2.2", "unhealthy", "IPMI-2.0", "SN-B")
    );
    let asked = sabakan.requests().len();
    wait_for("three more sabakan reads", SETTLE, || {
        (sabakan.requests().len() >= asked + 3)
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })?;
    let all = env.entries()?;
    assert_eq!(
        all.len(),
        1,
        "one entry per machine, no boot server: {all:#?}"
    );
    assert_eq!(
        sabakan.requests().last(),
        Some(&json!({
            "having": {"labels": null, "racks": null, "roles": null,
                       "states": ["UNHEALTHY", "UNREACHABLE"]},
            "notHaving": {"labels": null, "racks": null, "roles": ["boot"], "states": null}
        }))
    );
    let lines = env.events("10.0.2.2")?;
    let admitted: Vec<_> = lines.iter().filter(|l| l.outcome == "admitted").collect();
    assert_eq!(admitted.len(), 1, "{lines:#?}");
    assert_eq!(admitted[0].rule, "auto-repair");
    // The state's duration comes from its timestamp: at least the 90 s it was set back.
    let held_for = admitted[0].sentence.split("unhealthy for ").nth(1);
    assert!(
        held_for.is_some_and(|d| d.contains('m')),
        "{}",
        admitted[0].sentence
    );
    let s = env.status()?;
    let l = s
        .limits
        .iter()
        .find(|l| l.rule == "sabakan-unavailable")
        .expect("a sabakan line");
    assert!(
        !l.holding && l.sentence.contains("1 machine matches"),
        "{l:?}"
    );

    // 2. GraphQL errors: held with the reason; the last good answer is not used.
    sabakan.set_fault(Some(Fault::GraphQl("etcdserver: request timed out".into())));
    env.wait_held("GraphQL errors: etcdserver: request timed out", 1)?;
    env.coord.ctl(&["repair-queue", "delete-unfinished"])?;
    let l = env.wait_held("etcdserver", 6)?;
    assert_eq!(
        l.sentence,
        format!(
            "held: auto-repair reads sabakan at {}, which cannot be read: sabakan answered \
             with GraphQL errors: etcdserver: request timed out; nothing is enqueued from an \
             old answer",
            sabakan.url()
        )
    );
    let left: Vec<_> = env
        .entries()?
        .into_iter()
        .filter(|e| ["queued", "processing"].contains(&field(e, "status")))
        .collect();
    assert!(
        left.is_empty(),
        "nothing re-enqueued from the old answer: {left:#?}"
    );
    let s = env.status()?;
    let l = s
        .limits
        .iter()
        .find(|l| l.rule == "sabakan-unavailable")
        .expect("a sabakan line");
    assert!(l.holding && l.sentence.contains("etcdserver"), "{l:?}");

    // 3. sabakan answers again: derived afresh, the machine is still unhealthy.
    sabakan.set_fault(None);
    let e = env.wait_one_entry()?;
    assert_eq!(field(&e, "address"), "10.0.2.2");
    assert_eq!(
        env.events("10.0.2.2")?
            .iter()
            .filter(|l| l.outcome == "admitted")
            .count(),
        2
    );

    // 4. sabakan down.
    sabakan.stop();
    env.wait_held("cannot reach sabakan at", 2)?;
    let (_, metrics) = env.coord.http_get("/metrics")?;
    assert!(
        metrics.contains(
            "fleetmend_remediation_decisions_total{outcome=\"held\",rule=\"sabakan-unavailable\"}"
        ),
        "{metrics}"
    );
    Ok(())
}

/// sabakan over https with a private CA (`ca_file`): read like the plain one; with a CA
/// that did not sign sabakan's certificate, auto-repair holds and says the certificate is
/// the problem, and enqueues nothing.
#[test]
fn an_https_sabakan_is_read_with_its_ca_file_and_an_untrusted_one_holds() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let sabakan_ca = Pki::create(&tmp.path().join("sabakan-ca"), "sabakan.test")?;
    let tls = sabakan_ca.issue("coordinator", "sabakan", &["127.0.0.1".parse()?])?;
    let machines = || {
        vec![
            SabakanMachine::new("SN-A", "10.0.2.1", 1),
            SabakanMachine::new("SN-B", "10.0.2.2", 1).state("UNHEALTHY", Duration::from_secs(90)),
        ]
    };
    let sabakan = FakeSabakan::start_https(machines(), &tls.cert, &tls.key)?;
    assert!(sabakan.url().starts_with("https://"), "{}", sabakan.url());

    let env = Env::start_with(&sabakan.url(), Some(&tls.ca))?;
    let e = env.wait_one_entry()?;
    assert_eq!(field(&e, "address"), "10.0.2.2");
    assert_eq!(field(&e, "operation"), "unhealthy");
    drop(env);

    // Another CA: the handshake fails, auto-repair holds, nothing is enqueued.
    let other_ca = Pki::create(&tmp.path().join("other-ca"), "other.test")?;
    let wrong = other_ca.issue("admin", "x", &[])?;
    let env = Env::start_with(&sabakan.url(), Some(&wrong.ca))?;
    let l = env.wait_held("cannot reach sabakan at", 2)?;
    assert!(
        l.sentence.to_lowercase().contains("certificate"),
        "the reason names the certificate: {}",
        l.sentence
    );
    assert!(env.entries()?.is_empty(), "nothing enqueued");
    Ok(())
}

/// `coordinator check` of `env`'s configuration: its exit code and `sabakan` line.
fn check_sabakan_line(env: &Env) -> anyhow::Result<(Option<i32>, String)> {
    let out = testkit::procs::command("coordinator")
        .arg("check")
        .arg("--config")
        .arg(&env.coord.config)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.starts_with("sabakan"))
        .unwrap_or_default()
        .to_string();
    Ok((out.status.code(), format!("{line}\n{text}")))
}

/// A sabakan that answers with GraphQL errors, or a URL where nothing listens, passed
/// `coordinator check` (it did not look): the operator learnt of it from
/// `sabakan-unavailable` holds after the start.
#[test]
fn check_asks_sabakan_and_names_what_is_wrong() -> anyhow::Result<()> {
    let sabakan = FakeSabakan::start(vec![
        SabakanMachine::new("SN-A", "10.0.3.1", 1).state("UNHEALTHY", Duration::from_secs(90)),
    ])?;
    let env = Env::start(&sabakan.url())?;
    let (code, line) = check_sabakan_line(&env)?;
    assert_eq!(code, Some(0), "{line}");
    assert!(line.contains("answered: 1 machine match"), "{line}");

    sabakan.set_fault(Some(Fault::GraphQl("etcdserver: request timed out".into())));
    let (code, line) = check_sabakan_line(&env)?;
    assert_eq!(code, Some(64), "{line}");
    assert!(
        line.contains("etcdserver: request timed out") && line.contains(&sabakan.url()),
        "{line}"
    );
    drop(sabakan);
    let (code, line) = check_sabakan_line(&env)?;
    assert_eq!(code, Some(64), "{line}");
    assert!(line.contains("cannot reach sabakan"), "{line}");
    Ok(())
}
