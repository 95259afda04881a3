//! The packaged default configs (`packaging/*/*.toml`, installed as conffiles in
//! `/etc/fleetmend/`) load in the real binaries, and the certificate paths they name are the
//! ones each systemd unit waits for with `ConditionPathExists=`: if the two drifted apart, a
//! provisioned host would never start its service (or start it without its certificate).
//!
//! Building and checking the .deb files themselves is `packaging/build-debs.sh` and
//! `packaging/check-debs.sh` (docs/packaging.md); these tests only need the debug binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use testkit::procs::{command, workspace_root};

fn read(rel: &str) -> Result<String> {
    let p = workspace_root().join(rel);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The paths a unit's `ConditionPathExists=` lines require.
fn unit_conditions(unit: &str) -> Result<Vec<String>> {
    Ok(read(&format!("systemd/{unit}"))?
        .lines()
        .filter_map(|l| l.strip_prefix("ConditionPathExists="))
        .map(str::to_string)
        .collect())
}

/// The value of `key = "…"` (first match) in a packaged TOML file, also on a line commented
/// out with `#` (the node-agent's TLS paths are suggestions until `coordinator` is set).
fn toml_string(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        let k = k.trim();
        (k.strip_prefix('#').unwrap_or(k) == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

fn assert_conditions_match(config: &str, unit: &str, cert_key: &str, key_key: &str) -> Result<()> {
    let text = read(config)?;
    let want: Vec<String> = [cert_key, key_key]
        .iter()
        .map(|k| toml_string(&text, k).with_context(|| format!("{config} sets no {k}")))
        .collect::<Result<_>>()?;
    let have = unit_conditions(unit)?;
    if have != want {
        bail!("{unit} waits for {have:?}, but {config} names {want:?}");
    }
    Ok(())
}

#[test]
fn packaged_coordinator_config_loads_and_matches_its_unit() -> Result<()> {
    let path = workspace_root().join("packaging/coordinator/coordinator.toml");
    let cfg = coordinator::config::Config::load(&path)?;
    // The store must sit in the unit's StateDirectory=, the only place it may write.
    let unit = read("systemd/coordinator.service")?;
    let state = unit
        .lines()
        .find_map(|l| l.strip_prefix("StateDirectory="))
        .context("coordinator.service has no StateDirectory=")?;
    let state_dir = PathBuf::from("/var/lib").join(state);
    assert!(
        cfg.database.starts_with(&state_dir),
        "database {} is outside the StateDirectory {}",
        cfg.database.display(),
        state_dir.display()
    );
    assert_eq!(
        unit_conditions("coordinator.service")?,
        [&cfg.tls.cert, &cfg.tls.key].map(|p| p.display().to_string()),
    );
    Ok(())
}

#[test]
fn packaged_node_agent_config_loads_and_matches_its_unit() -> Result<()> {
    let config = workspace_root().join("packaging/node-agent/node-agent.toml");
    // `check` loads the config (exit 64 when it is unusable) and runs the checks once against
    // this machine, which may well fail them (exit 1): only the config matters here.
    let out = command("node-agent")
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(64), "config refused: {stderr}");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{:?}: {stderr}",
        out.status
    );
    assert_conditions_match(
        "packaging/node-agent/node-agent.toml",
        "node-agent.service",
        "cert",
        "key",
    )
}

#[test]
fn packaged_gateway_config_loads_and_matches_its_unit() -> Result<()> {
    let config = workspace_root().join("packaging/bmc-gateway/bmc-gateway.toml");
    // No [[bmc]] tables in the default config: `check` loads it and has no BMC to read. Its
    // TLS files (/etc/fleetmend/tls/gateway.*) are normally not on a build host: then the
    // tls line is the one failure (exit 1), never a refused config (64).
    let out = command("bmc-gateway")
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            || (out.status.code() == Some(1)
                && stdout.lines().filter(|l| l.contains("FAIL")).count() == 1
                && stdout.contains("tls  FAIL  TLS files: ")),
        "{:?}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_conditions_match(
        "packaging/bmc-gateway/bmc-gateway.toml",
        "bmc-gateway.service",
        "cert",
        "key",
    )
}

/// The packaged file with every setting shown commented out turned on: the lines `#key = …`,
/// `#[table]` and `#[[table]]` (no space after `#`; a prose comment has one).
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '[') => rest,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A key that no configuration type has: put in a table, the program's error names the keys
/// that table's type has (serde's "unknown field `…`, expected one of …").
const PROBE: &str = "fleetmend_probe_key";

/// One step down a TOML document: a key, or an element of an array of tables.
#[derive(Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// The table at `path` in `t` (the path was read from this document).
fn table_at<'a>(t: &'a mut toml::Table, path: &[Step]) -> &'a mut toml::Table {
    match path {
        [] => t,
        [Step::Key(k), rest @ ..] => value_table(t.get_mut(k).expect("key in document"), rest),
        [Step::Index(_), ..] => panic!("an index below a table"),
    }
}

fn value_table<'a>(v: &'a mut toml::Value, path: &[Step]) -> &'a mut toml::Table {
    match (v, path) {
        (toml::Value::Table(t), _) => table_at(t, path),
        (toml::Value::Array(a), [Step::Index(i), rest @ ..]) => value_table(&mut a[*i], rest),
        _ => panic!("the path ends at a table"),
    }
}

/// The keys the type behind the table at `path` has, asked of the program with [`PROBE`];
/// `None` when the table is a map whose keys the operator chooses (fence.machine_types,
/// labels, …): the probe is then refused for its value, not its name.
fn type_keys(
    doc: &toml::Table,
    path: &[Step],
    load: &dyn Fn(&str) -> Result<(), String>,
) -> Result<Option<BTreeSet<String>>> {
    let mut probed = doc.clone();
    table_at(&mut probed, path).insert(PROBE.into(), toml::Value::Integer(0));
    let text = toml::to_string(&probed)?;
    let Err(message) = load(&text) else {
        bail!("a table took the key {PROBE} without an error:\n{text}");
    };
    let marker = format!("unknown field `{PROBE}`, ");
    let Some(at) = message.find(&marker) else {
        return Ok(None);
    };
    let rest = message[at + marker.len()..].lines().next().unwrap_or("");
    Ok(Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    ))
}

/// Every table of `doc` (arrays of tables element by element), depth first, with its path,
/// its keys, and a name for its place in the schema: array elements share one (`[]`), and so
/// do the tables of a map (`*`).
fn compare_tables(
    doc: &toml::Table,
    path: Vec<Step>,
    schema: String,
    load: &dyn Fn(&str) -> Result<(), String>,
    shown: &mut BTreeMap<String, BTreeSet<String>>,
    known: &mut BTreeMap<String, BTreeSet<String>>,
) -> Result<()> {
    let mut copy = doc.clone();
    let table = table_at(&mut copy, &path).clone();
    let keys = type_keys(doc, &path, load)?;
    let is_map = keys.is_none();
    if let Some(keys) = keys {
        shown
            .entry(schema.clone())
            .or_default()
            .extend(table.keys().cloned());
        known.insert(schema.clone(), keys);
    }
    for (k, v) in &table {
        let child = if is_map { "*" } else { k.as_str() };
        let child_schema = if schema.is_empty() {
            child.to_string()
        } else {
            format!("{schema}.{child}")
        };
        let mut child_path = path.clone();
        child_path.push(Step::Key(k.clone()));
        match v {
            toml::Value::Table(_) => {
                compare_tables(doc, child_path, child_schema, load, shown, known)?
            }
            toml::Value::Array(items) if items.iter().all(toml::Value::is_table) => {
                for i in 0..items.len() {
                    let mut p = child_path.clone();
                    p.push(Step::Index(i));
                    compare_tables(doc, p, format!("{child_schema}[]"), load, shown, known)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks that `config`, with every commented-out setting turned on, loads (`loads_as`
/// judges the result), and that each of its tables shows every key of its configuration type
/// and no other: docs/packaging.md promises every key with its default.
fn assert_every_key_shown(
    config: &str,
    load: &dyn Fn(&str) -> Result<(), String>,
    loads_as: &dyn Fn(Result<(), String>) -> Result<()>,
) -> Result<()> {
    let text = uncommented(&read(config)?);
    loads_as(load(&text)).with_context(|| format!("{config}, every setting turned on"))?;
    let doc: toml::Table = text.parse()?;
    let (mut shown, mut known) = (BTreeMap::new(), BTreeMap::new());
    compare_tables(
        &doc,
        Vec::new(),
        String::new(),
        load,
        &mut shown,
        &mut known,
    )?;
    let mut wrong = Vec::new();
    for (schema, keys) in &known {
        let have = shown.get(schema).cloned().unwrap_or_default();
        let name = if schema.is_empty() {
            "(top level)"
        } else {
            schema
        };
        let missing: Vec<_> = keys.difference(&have).collect();
        let unknown: Vec<_> = have.difference(keys).collect();
        if !missing.is_empty() {
            wrong.push(format!("[{name}] does not show {missing:?}"));
        }
        if !unknown.is_empty() {
            wrong.push(format!(
                "[{name}] shows {unknown:?}, which its type does not have"
            ));
        }
    }
    if !wrong.is_empty() {
        bail!("{config}:\n  {}", wrong.join("\n  "));
    }
    Ok(())
}

/// Runs `program check --config FILE` on `text`: `Ok` unless it refused the configuration
/// (exit 64 with nothing on stdout: a check that ran prints its table, and the agent's also
/// exits 64 when its TLS files would keep `run` from starting), then its stderr.
fn check_command(program: &'static str) -> impl Fn(&str) -> Result<(), String> {
    move |text: &str| {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let file = dir.path().join("config.toml");
        std::fs::write(&file, text).map_err(|e| e.to_string())?;
        let out = command(program)
            .arg("check")
            .arg("--config")
            .arg(&file)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        match out.status.code() {
            Some(64) if out.stdout.is_empty() => {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
            _ => Ok(()),
        }
    }
}

#[test]
fn packaged_coordinator_config_shows_every_key_with_its_default() -> Result<()> {
    let load = |text: &str| {
        coordinator::config::Config::parse(text, std::path::Path::new("coordinator.toml"))
            .map(drop)
            .map_err(|e| e.to_string())
    };
    assert_every_key_shown("packaging/coordinator/coordinator.toml", &load, &|r| {
        r.map_err(anyhow::Error::msg)
    })
}

#[test]
fn packaged_node_agent_config_shows_every_key_with_its_default() -> Result<()> {
    assert_every_key_shown(
        "packaging/node-agent/node-agent.toml",
        &check_command("node-agent"),
        &|r| r.map_err(anyhow::Error::msg),
    )
}

#[test]
fn packaged_gateway_config_shows_every_key_with_its_default() -> Result<()> {
    // The examples' password files are not on a build host: the gateway reads them after the
    // whole file parsed, so that refusal (and only it) says every key was taken.
    assert_every_key_shown(
        "packaging/bmc-gateway/bmc-gateway.toml",
        &check_command("bmc-gateway"),
        &|r| match r {
            Err(e) if e.contains("password_file") && e.contains("/etc/fleetmend/bmc/") => Ok(()),
            Err(e) => bail!("{e}"),
            Ok(()) => bail!("the examples' password files were expected to be missing here"),
        },
    )
}
