//! Issue 33's end-to-end "must show", with real node-agent and coordinator processes:
//!
//! - a plugin check written in node-problem-detector's style turns from exit 0 to exit 1:
//!   the machine is unhealthy under the check's name, and a health check naming
//!   `plugin:NAME` enqueues the configured repair; exit 2 and a hanging plugin (its time
//!   limit) are `unknown` with the reason, and the hanging plugin's process group is gone
//!   afterwards;
//! - the agent against a fixture root whose `/dev/kmsg` stand-in receives Xid lines while
//!   it runs (fatal and benign, on several GPUs) and whose EDAC counters are raised: the
//!   `gpu` and `memory` checks fail naming the GPU and the DIMM, and a restarted agent
//!   does not report the old Xid lines again as new.
//!
//! Every wait is bounded by [`SETTLE`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use protocol::messages::{CheckKind, CheckResult, CheckStatus};
use serde_json::Value;
use testkit::ctl_json::MachineDetail;
use testkit::fixture::{AgentConfig, NodeFixture};
use testkit::procs::{Coordinator, CoordinatorOptions, Pki, Proc, start_agent, wait_for};

/// Bound for anything a test causes (the machine is shared and loaded: generous).
const SETTLE: Duration = Duration::from_secs(60);
const REPORT: Duration = Duration::from_millis(300);
const ADDR: &str = "10.0.1.1";

/// The repair for machine type `qemu`: leaves a mark naming the machine.
const REPAIR_YML: &str = r#"
repair:
  repair_procedures:
    - machine_types: ["qemu"]
      repair_operations:
        - operation: "ntp"
          repair_steps:
            - repair_command: ["sh", "-c", "touch @D@/repaired-$1", "repair"]
              watch_seconds: 600
          health_check_command: ["sh", "-c", "echo false", "check"]
"#;

/// A plugin in node-problem-detector's style: what it does is read from a file the test
/// writes (`ok`, `bad`, `unknown`, `hang`).
const PLUGIN: &str = r#"#!/bin/sh
# NPD custom plugin contract: exit 0 OK, 1 problem, 2 unknown; first line of stdout.
OK=0
NONOK=1
UNKNOWN=2
case "$(cat "$1")" in
  ok) echo "NTP is in sync"; exit $OK ;;
  bad) echo "NTP is not in sync: offset 2.5s"; echo "(second line)"; exit $NONOK ;;
  unknown) echo "cannot reach chronyd"; exit $UNKNOWN ;;
  hang)
    echo $$ > "$1.pids"
    sleep 300 &
    echo $! >> "$1.pids"
    wait ;;
esac
"#;

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    coord: Coordinator,
    fixture: NodeFixture,
    agent_config: PathBuf,
    agent: Option<Proc>,
    starts: u32,
}

impl Env {
    /// A coordinator with `tables` in `[remediation]` and one agent (`n1`) whose
    /// configuration ends with `checks` (`@D@` is the test's directory).
    fn start(tables: &str, checks: &str, fixture: NodeFixture) -> anyhow::Result<Self> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let d = dir.display().to_string();
        let pki = Pki::create(&dir.join("pki"), "e2e.test")?;
        let repair = dir.join("repair.yml");
        std::fs::write(&repair, REPAIR_YML.replace("@D@", &d))?;
        let extra = format!(
            "[repair]\nconfig = {:?}\n\n[remediation]\ninterval = \"300ms\"\nkdump_wait = \"0s\"\n\
             [remediation.limits]\nfleet_cap = {{ count = 10, percent = 100 }}\n\
             self_isolation = {{ settle = \"1s\" }}\n{tables}\n",
            repair.display().to_string()
        );
        let coord = Coordinator::start(
            &dir.join("coord"),
            &pki,
            &CoordinatorOptions {
                report_interval: REPORT,
                unreachable_grace: REPORT * 3,
                inventory: Some(format!(
                    "[[machines]]\naddress = \"{ADDR}\"\nhostname = \"n1\"\nserial = \"SN1\"\n\
                     rack = \"r1\"\nrole = \"cs\"\nmachine_type = \"qemu\"\n"
                )),
                extra,
                health_extra: String::new(),
            },
        )?;
        let tls = pki.issue("node", "n1", &[])?;
        let agent_config = fixture.write_agent_config(
            &AgentConfig::new(&coord.quic.to_string(), &tls.ca, &tls.cert, &tls.key)
                .report_interval(REPORT),
        )?;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&agent_config)?;
        let state = dir.join("agent-state");
        std::fs::create_dir_all(&state)?;
        write!(
            f,
            "\n[actions]\nstate_dir = {:?}\n\n{}",
            state.display().to_string(),
            checks.replace("@D@", &d)
        )?;
        let mut env = Self {
            _tmp: tmp,
            dir,
            coord,
            fixture,
            agent_config,
            agent: None,
            starts: 0,
        };
        env.start_agent()?;
        Ok(env)
    }

    fn start_agent(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = self.dir.join(format!("agent-{}.log", self.starts));
        self.agent = Some(start_agent("n1", &self.agent_config, &log)?);
        Ok(())
    }

    fn stop_agent(&mut self) -> anyhow::Result<()> {
        if let Some(mut a) = self.agent.take() {
            a.sigterm(SETTLE)?;
        }
        Ok(())
    }

    fn detail(&self) -> anyhow::Result<MachineDetail> {
        self.coord.machine(ADDR)
    }

    /// Waits until the last report's checks satisfy `pick`; returns what it picked.
    fn wait_checks<T>(
        &self,
        what: &str,
        pick: impl Fn(&[CheckResult]) -> Option<T>,
    ) -> anyhow::Result<T> {
        wait_for(what, SETTLE, || {
            let d = self.detail().map_err(|e| e.to_string())?;
            let checks = d.last_report.map(|r| r.checks).unwrap_or_default();
            pick(&checks).ok_or_else(|| format!("{checks:#?}"))
        })
    }

    fn entries(&self) -> anyhow::Result<Vec<Value>> {
        self.coord.ctl_json(&["repair-queue", "list", "--json"])
    }
}

fn one<'a>(checks: &'a [CheckResult], kind: CheckKind, subject: &str) -> Option<&'a CheckResult> {
    checks
        .iter()
        .find(|c| c.kind == kind && c.subject == subject)
}

fn set(path: &Path, what: &str) -> anyhow::Result<()> {
    std::fs::write(path, what)?;
    Ok(())
}

/// Whether process `pid` is gone (or a zombie: dead either way).
fn gone(pid: &str) -> bool {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    st.is_empty()
        || st
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
}

#[test]
fn an_npd_plugin_turning_to_exit_1_is_repaired_by_name_and_unknowns_say_why() -> anyhow::Result<()>
{
    let tmp = tempfile::tempdir()?;
    let plugin = tmp.path().join("check_ntp.sh");
    std::fs::write(&plugin, PLUGIN)?;
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let (ntp, other, slow) = (
        tmp.path().join("ntp"),
        tmp.path().join("other"),
        tmp.path().join("slow"),
    );
    set(&ntp, "ok")?;
    set(&other, "unknown")?;
    set(&slow, "ok")?;
    let exec = |name: &str, arg: &Path, extra: &str| {
        format!(
            "[[checks.exec]]\nname = \"{name}\"\npath = {:?}\nargs = [{:?}]\ninterval = \"300ms\"\n{extra}\n",
            plugin.display().to_string(),
            arg.display().to_string()
        )
    };
    let checks = format!(
        "{}{}{}",
        exec("ntp", &ntp, "timeout = \"300ms\""),
        exec("other", &other, "timeout = \"300ms\""),
        exec("slow", &slow, "timeout = \"300ms\"\nseverity = \"warning\"")
    );
    let tables = "[remediation.auto_repair]\nenabled = false\n\n[[remediation.health_checks]]\n\
                  name = \"ntp\"\nunhealthy_conditions = [{ type = \"plugin:ntp\", status = \"False\", timeout = \"1s\" }]\n\
                  max_unhealthy = 1\noperation = \"ntp\"\n";
    let fixture = NodeFixture::builder("n1").address(ADDR.parse()?).build()?;
    let env = Env::start(tables, &checks, fixture)?;
    env.coord.wait_for_state("n1", "healthy", SETTLE)?;

    // Exit 2: unknown with the plugin's message; the machine stays healthy.
    let r = env.wait_checks("plugin other unknown", |c| {
        one(c, CheckKind::Plugin, "other")
            .filter(|r| r.status == CheckStatus::Unknown)
            .cloned()
    })?;
    assert_eq!(r.detail, "unknown (exit 2): cannot reach chronyd");
    let r = env.wait_checks("plugin ntp ok", |c| {
        one(c, CheckKind::Plugin, "ntp").cloned()
    })?;
    assert_eq!(
        (r.status, r.detail.as_str()),
        (CheckStatus::Ok, "NTP is in sync")
    );

    // A hanging plugin: unknown, timed out, its whole process group killed.
    set(&slow, "hang")?;
    let r = env.wait_checks("plugin slow timed out", |c| {
        one(c, CheckKind::Plugin, "slow")
            .filter(|r| r.detail.starts_with("timed out"))
            .cloned()
    })?;
    assert_eq!(r.status, CheckStatus::Unknown);
    assert_eq!(
        r.detail,
        "timed out after 300ms; its process group was killed"
    );
    set(&slow, "ok")?;
    let pids = std::fs::read_to_string(slow.with_extension("pids"))?;
    let pids: Vec<&str> = pids.split_whitespace().collect();
    assert_eq!(pids.len(), 2, "the script and its sleep: {pids:?}");
    wait_for("the hanging plugin's processes to be gone", SETTLE, || {
        let alive: Vec<_> = pids.iter().filter(|p| !gone(p)).collect();
        if alive.is_empty() {
            Ok(())
        } else {
            Err(format!("alive: {alive:?}"))
        }
    })?;
    assert!(env.entries()?.is_empty(), "unknown is not a failure");

    // 0 → 1: unhealthy under the check's name, and the health check enqueues the repair.
    set(&ntp, "bad")?;
    let m = env.coord.wait_for_state("n1", "unhealthy", SETTLE)?;
    assert!(m.failing.contains(&"plugin:ntp".to_string()), "{m:?}");
    let d = env.detail()?;
    assert!(d.failing_since.contains_key("plugin:ntp"), "{d:?}");
    let r = one(&d.last_report.unwrap().checks, CheckKind::Plugin, "ntp")
        .cloned()
        .unwrap();
    assert_eq!(
        (r.status, r.detail.as_str()),
        (CheckStatus::Fail, "NTP is not in sync: offset 2.5s")
    );
    let mark = env.dir.join(format!("repaired-{ADDR}"));
    wait_for("the ntp repair", SETTLE, || {
        mark.exists()
            .then_some(())
            .ok_or_else(|| format!("{:?}", env.entries()))
    })?;
    let entries = env.entries()?;
    assert_eq!(entries.len(), 1, "{entries:#?}");
    assert_eq!(entries[0]["operation"], "ntp", "{entries:#?}");
    let events: Vec<testkit::ctl_json::JournalLine> =
        env.coord
            .ctl_json(&["events", "--machine", ADDR, "--json"])?;
    assert!(
        events
            .iter()
            .any(|l| l.outcome == "admitted" && l.sentence.contains("plugin:ntp is failing for")),
        "{events:#?}"
    );
    Ok(())
}

/// Appends kernel log records to the fixture's `/dev/kmsg` stand-in.
fn kmsg(f: &NodeFixture, lines: &[String]) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(f.path_of("dev/kmsg"))?;
    for l in lines {
        writeln!(file, "{l}")?;
    }
    Ok(())
}

fn edac(
    f: &NodeFixture,
    mc: u32,
    ue: u64,
    ce: u64,
    dimms: &[(&str, u64, u64)],
) -> anyhow::Result<()> {
    let d = format!("sys/devices/system/edac/mc/mc{mc}");
    f.write(&format!("{d}/ue_count"), &format!("{ue}\n"))?;
    f.write(&format!("{d}/ce_count"), &format!("{ce}\n"))?;
    for (i, (label, due, dce)) in dimms.iter().enumerate() {
        f.write(&format!("{d}/dimm{i}/dimm_label"), &format!("{label}\n"))?;
        f.write(&format!("{d}/dimm{i}/dimm_ue_count"), &format!("{due}\n"))?;
        f.write(&format!("{d}/dimm{i}/dimm_ce_count"), &format!("{dce}\n"))?;
    }
    Ok(())
}

#[test]
fn xids_and_ecc_errors_fail_the_gpu_and_memory_checks_and_a_restart_reports_nothing_new()
-> anyhow::Result<()> {
    let fixture = NodeFixture::builder("n1").address(ADDR.parse()?).build()?;
    for bus in ["3b", "86"] {
        let dev = format!("sys/bus/pci/devices/0000:{bus}:00.0");
        fixture.write(&format!("{dev}/vendor"), "0x10de\n")?;
        fixture.write(&format!("{dev}/class"), "0x030200\n")?;
    }
    fixture.write("dev/kmsg", "6,1,5000,-;Linux version 6.1.0\n")?;
    edac(
        &fixture,
        0,
        0,
        2,
        &[
            ("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", 0, 2),
            ("CPU_SrcID#0_MC#0_Chan#1_DIMM#0", 0, 0),
        ],
    )?;
    edac(&fixture, 1, 0, 0, &[("P1-DIMMB1", 0, 0)])?;
    let tables = "[remediation.auto_repair]\nenabled = false\n";
    let checks = "[checks.memory]\ncorrectable_per_window = 10\n";
    let mut env = Env::start(tables, checks, fixture)?;
    env.coord.wait_for_state("n1", "healthy", SETTLE)?;
    let c = env.wait_checks("gpu and memory results", |c| {
        Some((
            one(c, CheckKind::Gpu, "gpus")?.clone(),
            one(c, CheckKind::Memory, "mc0")?.clone(),
        ))
    })?;
    assert_eq!(c.0.status, CheckStatus::Ok, "{c:?}");
    assert!(c.0.detail.starts_with("2 NVIDIA GPU(s)"), "{c:?}");
    assert_eq!(c.1.status, CheckStatus::Ok, "{c:?}");

    // While the agent runs: a benign Xid on one GPU, a fatal one on the other.
    let f = &env.fixture;
    kmsg(f, &[
        "4,2,61000000,-;NVRM: Xid (PCI:0000:86:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)".into(),
        "4,3,62000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.".into(),
        " SUBSYSTEM=pci".into(),
        " DEVICE=+pci:0000:3b:00.0".into(),
    ])?;
    let m = env.coord.wait_for_state("n1", "unhealthy", SETTLE)?;
    assert_eq!(m.failing, ["gpu:0000:3b:00"], "{m:?}");
    let r = env.wait_checks("the fatal Xid", |c| {
        one(c, CheckKind::Gpu, "0000:3b:00").cloned()
    })?;
    assert_eq!(r.status, CheckStatus::Fail);
    assert!(
        r.detail
            .starts_with("Xid 79 (GPU has fallen off the bus) at 20"),
        "{r:?}"
    );
    assert!(
        r.detail
            .contains("[62.000000 s after boot]: asks for a node reboot"),
        "{r:?}"
    );
    let d = env.detail()?;
    let checks = d.last_report.unwrap().checks;
    assert!(
        one(&checks, CheckKind::Gpu, "0000:86:00").is_none(),
        "an application Xid is not a problem: {checks:#?}"
    );

    // Uncorrectable ECC errors on one DIMM, a burst of corrected ones on another controller.
    edac(
        f,
        0,
        1,
        2,
        &[
            ("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", 0, 2),
            ("CPU_SrcID#0_MC#0_Chan#1_DIMM#0", 1, 0),
        ],
    )?;
    let r = env.wait_checks("the uncorrectable error", |c| {
        one(c, CheckKind::Memory, "mc0")
            .filter(|r| r.status == CheckStatus::Fail)
            .cloned()
    })?;
    assert_eq!(
        r.detail,
        "1 uncorrectable memory error(s) this boot: DIMM CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (1 uncorrectable); 2 corrected"
    );
    edac(f, 1, 0, 50, &[("P1-DIMMB1", 0, 50)])?;
    let r = env.wait_checks("the corrected burst", |c| {
        one(c, CheckKind::Memory, "mc1")
            .filter(|r| r.status == CheckStatus::Warn)
            .cloned()
    })?;
    assert!(
        r.detail
            .starts_with("50 corrected memory errors within 1h (more than 10): DIMM P1-DIMMB1 (50"),
        "{r:?}"
    );
    let m = env.coord.wait_for_state("n1", "unhealthy", SETTLE)?;
    let mut failing = m.failing.clone();
    failing.sort();
    assert_eq!(failing, ["gpu:0000:3b:00", "memory:mc0"], "{m:?}");

    // A restart of the agent: the fatal Xid is still reported (the GPU is still gone), the
    // old lines are not counted again, and a new one after the restart is.
    let before = env.wait_checks("the fatal Xid", |c| {
        one(c, CheckKind::Gpu, "0000:3b:00").cloned()
    })?;
    env.stop_agent()?;
    let last_seq = env.detail()?.last_report.map_or(0, |r| r.seq);
    env.start_agent()?;
    let agent = env.agent.as_ref().unwrap();
    // The restarted agent's reports count from 1 again.
    let after = wait_for("a report of the restarted agent", SETTLE, || {
        let r = env.detail().map_err(|e| e.to_string())?.last_report;
        r.filter(|r| r.seq < last_seq)
            .and_then(|r| one(&r.checks, CheckKind::Gpu, "0000:3b:00").cloned())
            .ok_or_else(|| "no report of the new agent yet".to_string())
    })?;
    assert_eq!(after, before, "the same finding, not a new one");
    assert!(
        !agent.log_text().contains("GPU Xid error"),
        "old lines logged again as new: {}",
        agent.log_text()
    );
    kmsg(
        &env.fixture,
        &["4,4,90000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE (0x1)".into()],
    )?;
    let r = env.wait_checks("the new Xid", |c| {
        one(c, CheckKind::Gpu, "0000:3b:00")
            .filter(|r| r.detail.contains("Xid 48"))
            .cloned()
    })?;
    assert!(r.detail.contains("2 Xids on this GPU this boot"), "{r:?}");
    env.agent
        .as_ref()
        .unwrap()
        .wait_for_log(&["GPU Xid error"], SETTLE)?;
    Ok(())
}
