//! Loading the `repair:` section from YAML: CKE's keys and defaults, strictly validated.
//!
//! A CKE `cluster.yml` loads unchanged: only its `repair:` section is read, every other
//! top-level key is reported back to the caller (who logs a notice). Unlike CKE, an unknown
//! key inside `repair:` is an error naming its full path
//! (`repair.repair_procedures[0].repair_operations[1].repair_steps[0].repair_comand`), and
//! invalid values (negative numbers, empty commands, a machine type with the same operation
//! twice, an unknown built-in) are refused at load time rather than at repair time.
//!
//! This module parses and validates only, into the types of [`super::config`]; it runs
//! nothing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::config::{
    AgentStep, Builtin, CommandSpec, DEFAULT_COMMAND_TIMEOUT_SECONDS,
    DEFAULT_EVICTION_TIMEOUT_SECONDS, DEFAULT_MAX_CONCURRENT_REPAIRS, LabelSelector, RepairConfig,
    RepairOperation, RepairProcedure, RepairStep,
};

/// Why a repair configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RepairConfigError {
    /// The file could not be read.
    #[error("cannot read repair config {file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error("repair config {file}: not valid YAML: {message}")]
    Yaml {
        /// The file.
        file: PathBuf,
        /// The parser's message, with position.
        message: String,
    },
    /// A key is unknown, missing, or has an unusable value.
    #[error("repair config {file}: `{key}`: {message}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The key's full path, e.g. `repair.repair_procedures[0].machine_types`.
        key: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

impl RepairConfigError {
    /// Never: a configuration must be fixed by a person.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// A loaded configuration and the top-level keys that were ignored.
#[derive(Debug, Clone)]
pub struct LoadedRepairConfig {
    /// The `repair:` section.
    pub config: RepairConfig,
    /// Top-level keys other than `repair` (a CKE cluster.yml has many), for a notice.
    pub ignored_keys: Vec<String>,
    /// Settings that load but are likely mistakes, each naming its key, for a warning.
    pub warnings: Vec<String>,
}

/// The node-agent's default `[actions] command_timeout`, in seconds: a `@restart-unit` step
/// with a shorter limit may give up while the agent's restart still runs.
const AGENT_COMMAND_TIMEOUT_SECONDS: u64 = 60;

/// `@restart-unit` steps whose limit is shorter than the agent may take for the restart.
/// Not an error: an agent configured with a shorter `command_timeout` makes them fine, and a
/// retry of a step that gave up shares the restart still running on the agent.
fn short_restart_limits(config: &RepairConfig) -> Vec<String> {
    let mut out = Vec::new();
    for (p, proc_) in config.repair_procedures.iter().enumerate() {
        for (o, op) in proc_.repair_operations.iter().enumerate() {
            for (s, step) in op.repair_steps.iter().enumerate() {
                let t = step.command_timeout_seconds;
                if matches!(
                    step.repair_command,
                    CommandSpec::Agent(AgentStep::RestartUnit(_))
                ) && t > 0
                    && t < AGENT_COMMAND_TIMEOUT_SECONDS
                {
                    out.push(format!(
                        "repair.repair_procedures[{p}].repair_operations[{o}].repair_steps[{s}].command_timeout_seconds: {t} s is shorter than the node-agent's default [actions] command_timeout ({AGENT_COMMAND_TIMEOUT_SECONDS} s): the step may give up while the restart still runs (its retry then waits for that restart); set it to at least {AGENT_COMMAND_TIMEOUT_SECONDS}, or lower the agents' command_timeout"
                    ));
                }
            }
        }
    }
    out
}

/// Reads and validates a YAML file with a `repair:` section.
pub fn load_file(file: &Path) -> Result<LoadedRepairConfig, RepairConfigError> {
    let text =
        protocol::file::read_regular_to_string(file).map_err(|source| RepairConfigError::Read {
            file: file.to_path_buf(),
            source,
        })?;
    let loaded = load_str(&text, file)?;
    for w in &loaded.warnings {
        tracing::warn!(file = %file.display(), "repair config: {w}");
    }
    if !loaded.ignored_keys.is_empty() {
        tracing::info!(
            file = %file.display(),
            keys = %loaded.ignored_keys.join(", "),
            "repair config: ignoring top-level keys other than `repair`"
        );
    }
    Ok(loaded)
}

/// Parses and validates YAML text; `file` only names the source in errors.
pub fn load_str(text: &str, file: &Path) -> Result<LoadedRepairConfig, RepairConfigError> {
    let doc: Value = serde_saphyr::from_str(text).map_err(|e| RepairConfigError::Yaml {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let p = Parser { file };
    let top = match &doc {
        Value::Object(m) => m,
        _ => return Err(p.invalid("(document)", "expected a mapping with a `repair:` key")),
    };
    let ignored_keys = top.keys().filter(|k| *k != "repair").cloned().collect();
    let repair = top
        .get("repair")
        .filter(|v| !v.is_null())
        .ok_or_else(|| p.invalid("repair", "missing: the file has no `repair:` section"))?;
    let config = p.repair(repair)?;
    Ok(LoadedRepairConfig {
        warnings: short_restart_limits(&config),
        config,
        ignored_keys,
    })
}

struct Parser<'a> {
    file: &'a Path,
}

impl Parser<'_> {
    fn invalid(&self, key: &str, message: impl Into<String>) -> RepairConfigError {
        RepairConfigError::Invalid {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    fn map<'v>(
        &self,
        v: &'v Value,
        path: &str,
    ) -> Result<&'v Map<String, Value>, RepairConfigError> {
        v.as_object()
            .ok_or_else(|| self.invalid(path, "expected a mapping"))
    }

    fn check_keys(
        &self,
        m: &Map<String, Value>,
        path: &str,
        allowed: &[&str],
    ) -> Result<(), RepairConfigError> {
        for k in m.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.invalid(
                    &format!("{path}.{k}"),
                    format!("unknown key; allowed here: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn get<'v>(m: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
        m.get(key).filter(|v| !v.is_null())
    }

    fn uint(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
        default: u64,
    ) -> Result<u64, RepairConfigError> {
        let Some(v) = Self::get(m, key) else {
            return Ok(default);
        };
        let at = format!("{path}.{key}");
        match v {
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    Ok(u)
                } else if n.as_i64().is_some() || n.as_f64().is_some_and(|f| f < 0.0) {
                    Err(self.invalid(&at, format!("must not be negative, got {n}")))
                } else if n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                    // Past u64, serde reads a float and would print it as `1e20`.
                    Err(self.invalid(&at, "too large"))
                } else {
                    Err(self.invalid(&at, format!("must be a whole number, got {n}")))
                }
            }
            other => Err(self.invalid(&at, format!("expected a number, got {other}"))),
        }
    }

    fn u32(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
        default: u32,
    ) -> Result<u32, RepairConfigError> {
        let v = self.uint(m, path, key, u64::from(default))?;
        u32::try_from(v).map_err(|_| self.invalid(&format!("{path}.{key}"), "too large"))
    }

    fn boolean(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Result<bool, RepairConfigError> {
        match Self::get(m, key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.invalid(
                &format!("{path}.{key}"),
                format!("expected true or false, got {other}"),
            )),
        }
    }

    fn string(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Result<String, RepairConfigError> {
        let at = format!("{path}.{key}");
        match Self::get(m, key) {
            None => Err(self.invalid(&at, "missing")),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Value::String(_)) => Err(self.invalid(&at, "must not be empty")),
            Some(other) => Err(self.invalid(&at, format!("expected a string, got {other}"))),
        }
    }

    fn strings(&self, v: &Value, at: &str) -> Result<Vec<String>, RepairConfigError> {
        let list = v
            .as_array()
            .ok_or_else(|| self.invalid(at, "expected a list of strings"))?;
        list.iter()
            .enumerate()
            .map(|(i, s)| match s {
                Value::String(s) => Ok(s.clone()),
                // YAML turns `- 1` or `- true` into non-strings; CKE's Go decoder refuses
                // them too, so say so instead of guessing a spelling.
                other => Err(self.invalid(
                    &format!("{at}[{i}]"),
                    format!("expected a string, got {other}; quote it"),
                )),
            })
            .collect()
    }

    fn list<'v>(
        &self,
        m: &'v Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Result<&'v Vec<Value>, RepairConfigError> {
        let at = format!("{path}.{key}");
        let v = Self::get(m, key).ok_or_else(|| self.invalid(&at, "missing"))?;
        let list = v
            .as_array()
            .ok_or_else(|| self.invalid(&at, "expected a list"))?;
        if list.is_empty() {
            return Err(self.invalid(&at, "must not be empty"));
        }
        Ok(list)
    }

    fn command(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
        allowed: &[Builtin],
    ) -> Result<Option<CommandSpec>, RepairConfigError> {
        let Some(v) = Self::get(m, key) else {
            return Ok(None);
        };
        let at = format!("{path}.{key}");
        let argv = self.strings(v, &at)?;
        let Some(first) = argv.first() else {
            return Err(self.invalid(&at, "must not be empty"));
        };
        if first.trim().is_empty() {
            return Err(self.invalid(&format!("{at}[0]"), "program must not be empty"));
        }
        // Agent steps are repair steps only: a health check must not reboot anything.
        if key == "repair_command"
            && let Some(step) = AgentStep::parse(&argv)
        {
            return step
                .map(|s| Some(CommandSpec::Agent(s)))
                .map_err(|e| self.invalid(&at, e));
        }
        if let Some(name) = first.strip_prefix('@') {
            let builtin = Builtin::parse(first).ok_or_else(|| {
                self.invalid(
                    &format!("{at}[0]"),
                    format!("unknown built-in action `@{name}`; known: @power-cycle, @power-off, @power-on, @fence, @agent-healthy, {}", AgentStep::NAMES),
                )
            })?;
            if !allowed.contains(&builtin) {
                let mut names: Vec<&str> = allowed.iter().map(|b| b.name()).collect();
                // The agent's steps are built-ins of repair commands too.
                let agent_steps = key == "repair_command";
                if agent_steps {
                    names.push(AgentStep::NAMES);
                }
                return Err(self.invalid(
                    &format!("{at}[0]"),
                    format!(
                        "`{}` cannot be used here; allowed built-ins here: {}",
                        builtin.name(),
                        names.join(", ")
                    ),
                ));
            }
            if argv.len() > 1 {
                return Err(self.invalid(&at, "a built-in action takes no arguments"));
            }
            return Ok(Some(CommandSpec::Builtin(builtin)));
        }
        Ok(Some(CommandSpec::External(argv)))
    }

    fn required_command(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
        allowed: &[Builtin],
    ) -> Result<CommandSpec, RepairConfigError> {
        self.command(m, path, key, allowed)?
            .ok_or_else(|| self.invalid(&format!("{path}.{key}"), "missing"))
    }

    fn selector(
        &self,
        m: &Map<String, Value>,
        path: &str,
        key: &str,
    ) -> Result<Option<LabelSelector>, RepairConfigError> {
        let Some(v) = Self::get(m, key) else {
            return Ok(None);
        };
        let at = format!("{path}.{key}");
        let sm = self.map(v, &at)?;
        self.check_keys(sm, &at, &["matchLabels", "matchExpressions"])?;
        let mut sel = LabelSelector::default();
        if let Some(labels) = Self::get(sm, "matchLabels") {
            let lat = format!("{at}.matchLabels");
            let mut match_labels = Vec::new();
            for (k, v) in self.map(labels, &lat)? {
                match v {
                    Value::String(s) => match_labels.push((k.clone(), s.clone())),
                    other => {
                        return Err(self.invalid(
                            &format!("{lat}.{k}"),
                            format!("expected a string, got {other}; quote it"),
                        ));
                    }
                }
            }
            match_labels.sort();
            for (k, v) in match_labels {
                sel = sel.with_label(k, v);
            }
        }
        if let Some(exprs) = Self::get(sm, "matchExpressions") {
            let eat = format!("{at}.matchExpressions");
            let list = exprs
                .as_array()
                .ok_or_else(|| self.invalid(&eat, "expected a list"))?;
            for (i, e) in list.iter().enumerate() {
                let xat = format!("{eat}[{i}]");
                let em = self.map(e, &xat)?;
                self.check_keys(em, &xat, &["key", "operator", "values"])?;
                let key = self.string(em, &xat, "key")?;
                let op = self.string(em, &xat, "operator")?;
                let values = match Self::get(em, "values") {
                    Some(v) => self.strings(v, &format!("{xat}.values"))?,
                    None => Vec::new(),
                };
                match op.as_str() {
                    "In" | "NotIn" if values.is_empty() => {
                        return Err(self.invalid(
                            &format!("{xat}.values"),
                            format!("operator {op} needs at least one value"),
                        ));
                    }
                    "Exists" | "DoesNotExist" if !values.is_empty() => {
                        return Err(self.invalid(
                            &format!("{xat}.values"),
                            format!("operator {op} takes no values"),
                        ));
                    }
                    "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                    _ => {
                        return Err(self.invalid(
                            &format!("{xat}.operator"),
                            "must be In, NotIn, Exists or DoesNotExist",
                        ));
                    }
                }
                sel = sel
                    .with_expression(key, &op, values)
                    .ok_or_else(|| self.invalid(&format!("{xat}.operator"), "unknown operator"))?;
            }
        }
        Ok(Some(sel))
    }

    fn repair(&self, v: &Value) -> Result<RepairConfig, RepairConfigError> {
        let path = "repair";
        let m = self.map(v, path)?;
        self.check_keys(
            m,
            path,
            &[
                "repair_procedures",
                "max_concurrent_repairs",
                "protected_namespaces",
                "protected_job_pods",
                "evict_retries",
                "evict_interval",
                "eviction_timeout_seconds",
            ],
        )?;
        let mut procedures = Vec::new();
        let mut seen: HashSet<(String, String)> = HashSet::new();
        for (i, pv) in self.list(m, path, "repair_procedures")?.iter().enumerate() {
            let ppath = format!("{path}.repair_procedures[{i}]");
            let proc = self.procedure(pv, &ppath)?;
            let types = &proc.machine_types;
            if let Some((k, t)) = types
                .iter()
                .enumerate()
                .find(|(k, t)| types[..*k].contains(t))
            {
                return Err(self.invalid(
                    &format!("{ppath}.machine_types[{k}]"),
                    format!("machine type `{t}` is listed twice in this procedure"),
                ));
            }
            for (j, op) in proc.repair_operations.iter().enumerate() {
                for t in &proc.machine_types {
                    if !seen.insert((t.clone(), op.operation.clone())) {
                        return Err(self.invalid(
                            &format!("{ppath}.repair_operations[{j}].operation"),
                            format!(
                                "machine type `{t}` already has an operation `{}`; each (machine type, operation) pair may appear once",
                                op.operation
                            ),
                        ));
                    }
                }
            }
            procedures.push(proc);
        }
        let max_concurrent_repairs = self.u32(
            m,
            path,
            "max_concurrent_repairs",
            DEFAULT_MAX_CONCURRENT_REPAIRS,
        )?;
        if max_concurrent_repairs == 0 {
            return Err(self.invalid(
                "repair.max_concurrent_repairs",
                "must be at least 1 (disable the queue with `coordinatorctl repair-queue disable`)",
            ));
        }
        let eviction_timeout_seconds = self.uint(
            m,
            path,
            "eviction_timeout_seconds",
            DEFAULT_EVICTION_TIMEOUT_SECONDS,
        )?;
        if eviction_timeout_seconds == 0 {
            return Err(self.invalid("repair.eviction_timeout_seconds", "must be positive"));
        }
        Ok(RepairConfig {
            repair_procedures: procedures,
            max_concurrent_repairs,
            protected_namespaces: self.selector(m, path, "protected_namespaces")?,
            protected_job_pods: self.selector(m, path, "protected_job_pods")?,
            evict_retries: self.u32(m, path, "evict_retries", 0)?,
            evict_interval: self.uint(m, path, "evict_interval", 0)?,
            eviction_timeout_seconds,
        })
    }

    fn procedure(&self, v: &Value, path: &str) -> Result<RepairProcedure, RepairConfigError> {
        let m = self.map(v, path)?;
        self.check_keys(m, path, &["machine_types", "repair_operations"])?;
        let types_at = format!("{path}.machine_types");
        let machine_types = self.strings(
            Self::get(m, "machine_types").ok_or_else(|| self.invalid(&types_at, "missing"))?,
            &types_at,
        )?;
        if machine_types.is_empty() {
            return Err(self.invalid(&types_at, "must not be empty"));
        }
        if let Some(i) = machine_types.iter().position(|t| t.trim().is_empty()) {
            return Err(self.invalid(&format!("{types_at}[{i}]"), "must not be empty"));
        }
        let mut ops = Vec::new();
        for (i, ov) in self.list(m, path, "repair_operations")?.iter().enumerate() {
            ops.push(self.operation(ov, &format!("{path}.repair_operations[{i}]"))?);
        }
        Ok(RepairProcedure {
            machine_types,
            repair_operations: ops,
        })
    }

    fn operation(&self, v: &Value, path: &str) -> Result<RepairOperation, RepairConfigError> {
        let m = self.map(v, path)?;
        self.check_keys(
            m,
            path,
            &[
                "operation",
                "repair_steps",
                "health_check_command",
                "command_timeout_seconds",
                "success_command",
                "success_command_timeout",
            ],
        )?;
        let operation = self.string(m, path, "operation")?;
        let mut steps = Vec::new();
        for (i, sv) in self.list(m, path, "repair_steps")?.iter().enumerate() {
            steps.push(self.step(sv, &format!("{path}.repair_steps[{i}]"))?);
        }
        let power = [
            Builtin::PowerCycle,
            Builtin::PowerOff,
            Builtin::PowerOn,
            Builtin::Fence,
        ];
        Ok(RepairOperation {
            operation,
            repair_steps: steps,
            health_check_command: self.required_command(
                m,
                path,
                "health_check_command",
                &[Builtin::AgentHealthy],
            )?,
            command_timeout_seconds: self.uint(
                m,
                path,
                "command_timeout_seconds",
                DEFAULT_COMMAND_TIMEOUT_SECONDS,
            )?,
            success_command: self.command(m, path, "success_command", &power)?,
            success_command_timeout: self.uint(
                m,
                path,
                "success_command_timeout",
                DEFAULT_COMMAND_TIMEOUT_SECONDS,
            )?,
        })
    }

    fn step(&self, v: &Value, path: &str) -> Result<RepairStep, RepairConfigError> {
        let m = self.map(v, path)?;
        self.check_keys(
            m,
            path,
            &[
                "repair_command",
                "command_timeout_seconds",
                "command_retries",
                "command_interval",
                "need_drain",
                "watch_seconds",
            ],
        )?;
        Ok(RepairStep {
            repair_command: self.required_command(
                m,
                path,
                "repair_command",
                &[
                    Builtin::PowerCycle,
                    Builtin::PowerOff,
                    Builtin::PowerOn,
                    Builtin::Fence,
                ],
            )?,
            command_timeout_seconds: self.uint(
                m,
                path,
                "command_timeout_seconds",
                DEFAULT_COMMAND_TIMEOUT_SECONDS,
            )?,
            command_retries: self.u32(m, path, "command_retries", 0)?,
            command_interval: self.uint(m, path, "command_interval", 0)?,
            need_drain: self.boolean(m, path, "need_drain")?,
            watch_seconds: self.uint(m, path, "watch_seconds", 0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::config::NoMatch;

    /// The `repair:` section of CKE's own example, inside a CKE cluster.yml with the other
    /// keys a real one has.
    const CKE_CLUSTER_YML: &str = r#"
name: mtest
nodes:
  - address: 10.0.0.101
    user: cybozu
    control_plane: true
  - address: 10.0.0.102
    user: cybozu
service_subnet: 10.34.56.0/24
reboot:
  reboot_command: ["true"]
  boot_check_command: ["bash", "-c", "echo 'true'"]
  eviction_timeout_seconds: 30
  command_timeout_seconds: 30
repair:
  repair_procedures:
    - machine_types: ["Cray-1", "Cray-2"]
      repair_operations:
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["sh", "-c", "touch /tmp/mtest-repair-$1", "repair"]
              need_drain: true
              watch_seconds: 30
            - repair_command: ["sh", "-c", "touch /tmp/mtest-repair-2-$1", "repair"]
              command_timeout_seconds: 10
              command_retries: 1
              command_interval: 5
              watch_seconds: 30
          health_check_command: ["sh", "-c", "test -f /tmp/mtest-repair-$1 && echo true", "health_check"]
          command_timeout_seconds: 30
          success_command: ["sh", "-c", "touch /tmp/mtest-repair-success-$1", "success"]
          success_command_timeout: 60
  max_concurrent_repairs: 2
  protected_namespaces:
    matchLabels:
      app: protected
  protected_job_pods:
    matchLabels:
      kind: protected
  evict_retries: 3
  evict_interval: 3
  eviction_timeout_seconds: 120
options:
  kubelet:
    extra_args: ["--foo"]
"#;

    fn load(text: &str) -> Result<LoadedRepairConfig, RepairConfigError> {
        load_str(text, Path::new("test.yml"))
    }

    fn err_key(text: &str) -> (String, String) {
        match load(text) {
            Err(RepairConfigError::Invalid { key, message, .. }) => (key, message),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn cke_cluster_yml_loads_unchanged() {
        let loaded = load(CKE_CLUSTER_YML).unwrap();
        assert_eq!(
            loaded.ignored_keys,
            vec!["name", "nodes", "options", "reboot", "service_subnet"]
        );
        let c = loaded.config;
        assert_eq!(c.max_concurrent_repairs, 2);
        assert_eq!(c.evict_retries, 3);
        assert_eq!(c.evict_interval, 3);
        assert_eq!(c.eviction_timeout_seconds, 120);
        assert_eq!(
            c.drain_options().protected_namespaces.as_deref(),
            Some("app=protected")
        );
        assert_eq!(
            c.drain_options().protected_job_pods.as_deref(),
            Some("kind=protected")
        );
        let op = c.operation_for("Cray-2", "unreachable").unwrap();
        assert_eq!(op.repair_steps.len(), 2);
        assert!(op.repair_steps[0].need_drain);
        assert_eq!(op.repair_steps[0].command_timeout_seconds, 30, "default");
        assert_eq!(op.repair_steps[0].command_retries, 0, "default");
        assert_eq!(op.repair_steps[1].command_timeout_seconds, 10);
        assert_eq!(op.repair_steps[1].command_retries, 1);
        assert_eq!(op.repair_steps[1].command_interval, 5);
        assert_eq!(op.success_command_timeout, 60);
        assert_eq!(
            op.repair_steps[0].repair_command,
            CommandSpec::External(vec![
                "sh".into(),
                "-c".into(),
                "touch /tmp/mtest-repair-$1".into(),
                "repair".into()
            ])
        );
        assert!(matches!(
            c.operation_for("Cray-3", "unreachable"),
            Err(NoMatch::MachineType(_))
        ));
        assert!(matches!(
            c.operation_for("Cray-1", "reboot"),
            Err(NoMatch::Operation { .. })
        ));
    }

    #[test]
    fn a_machine_type_listed_twice_is_named_as_such() {
        let (key, message) = err_key(
            "repair:\n  repair_procedures:\n  - machine_types: [t, u, t]\n    repair_operations:\n    - operation: op\n      repair_steps:\n      - repair_command: [echo]\n      health_check_command: [echo, 'true']\n",
        );
        assert!(
            key.ends_with("repair_procedures[0].machine_types[2]"),
            "{key}"
        );
        assert!(message.contains("`t` is listed twice"), "{message}");
    }

    #[test]
    fn defaults_are_ckes() {
        let c = load(
            "repair:\n  repair_procedures:\n  - machine_types: [t]\n    repair_operations:\n    - operation: op\n      repair_steps:\n      - repair_command: [echo]\n      health_check_command: [echo, 'true']\n",
        )
        .unwrap()
        .config;
        assert_eq!(c.max_concurrent_repairs, 1);
        assert_eq!(c.evict_retries, 0);
        assert_eq!(c.evict_interval, 0);
        assert_eq!(c.eviction_timeout_seconds, 600);
        assert_eq!(c.protected_namespaces, None);
        assert_eq!(c.protected_job_pods, None);
        let op = c.operation_for("t", "op").unwrap();
        assert_eq!(op.command_timeout_seconds, 30);
        assert_eq!(op.success_command, None);
        assert_eq!(op.success_command_timeout, 30);
        let s = &op.repair_steps[0];
        assert_eq!(
            (
                s.command_timeout_seconds,
                s.command_retries,
                s.command_interval,
                s.need_drain,
                s.watch_seconds
            ),
            (30, 0, 0, false, 0)
        );
    }

    #[test]
    fn unknown_key_names_its_full_path() {
        let text = CKE_CLUSTER_YML.replace(
            "command_timeout_seconds: 10",
            "command_timeout_seconds: 10\n              repair_comand: [x]",
        );
        let (key, message) = err_key(&text);
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].repair_steps[1].repair_comand"
        );
        assert!(message.contains("unknown key"), "{message}");
        let (key, _) = err_key(&CKE_CLUSTER_YML.replace("  evict_retries: 3", "  evict_retry: 3"));
        assert_eq!(key, "repair.evict_retry");
        let (key, _) =
            err_key(&CKE_CLUSTER_YML.replace("matchLabels:\n      app", "matchLabel:\n      app"));
        assert_eq!(key, "repair.protected_namespaces.matchLabel");
    }

    #[test]
    fn negative_timeouts_are_refused() {
        let (key, message) = err_key(
            &CKE_CLUSTER_YML.replace("command_timeout_seconds: 10", "command_timeout_seconds: -1"),
        );
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].repair_steps[1].command_timeout_seconds"
        );
        assert!(message.contains("negative"), "{message}");
        let (key, _) = err_key(
            &CKE_CLUSTER_YML.replace("success_command_timeout: 60", "success_command_timeout: -5"),
        );
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].success_command_timeout"
        );
        let (key, _) = err_key(&CKE_CLUSTER_YML.replace(
            "eviction_timeout_seconds: 120",
            "eviction_timeout_seconds: 0",
        ));
        assert_eq!(key, "repair.eviction_timeout_seconds");
    }

    #[test]
    fn numbers_past_the_largest_whole_number_are_too_large_and_not_printed_as_floats() {
        let big = "command_timeout_seconds: 99999999999999999999";
        let (key, message) = err_key(&CKE_CLUSTER_YML.replace("command_timeout_seconds: 10", big));
        assert!(
            key.ends_with("repair_steps[1].command_timeout_seconds"),
            "{key}"
        );
        assert_eq!(message, "too large");
        let (_, message) = err_key(&CKE_CLUSTER_YML.replace(
            "command_timeout_seconds: 10",
            "command_timeout_seconds: -99999999999999999999",
        ));
        assert!(message.contains("negative"), "{message}");
        let (_, message) = err_key(&CKE_CLUSTER_YML.replace(
            "command_timeout_seconds: 10",
            "command_timeout_seconds: 1.5",
        ));
        assert!(message.contains("whole number, got 1.5"), "{message}");
    }

    #[test]
    fn empty_commands_are_refused() {
        let (key, _) = err_key(&CKE_CLUSTER_YML.replace(
            r#"repair_command: ["sh", "-c", "touch /tmp/mtest-repair-$1", "repair"]"#,
            "repair_command: []",
        ));
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].repair_steps[0].repair_command"
        );
        let (key, _) = err_key(&CKE_CLUSTER_YML.replace(
            r#"health_check_command: ["sh", "-c", "test -f /tmp/mtest-repair-$1 && echo true", "health_check"]"#,
            r#"health_check_command: [""]"#,
        ));
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].health_check_command[0]"
        );
        let (key, message) = err_key(
            "repair:\n  repair_procedures:\n  - machine_types: [t]\n    repair_operations:\n    - operation: op\n      repair_steps: []\n      health_check_command: [echo]\n",
        );
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].repair_steps"
        );
        assert!(message.contains("empty"), "{message}");
    }

    #[test]
    fn duplicate_operation_for_a_machine_type_is_refused() {
        let text = CKE_CLUSTER_YML.replace(
            "  max_concurrent_repairs: 2",
            "    - machine_types: [\"Cray-2\"]\n      repair_operations:\n        - operation: unreachable\n          repair_steps:\n            - repair_command: [echo]\n          health_check_command: [echo]\n  max_concurrent_repairs: 2",
        );
        let (key, message) = err_key(&text);
        assert_eq!(
            key,
            "repair.repair_procedures[1].repair_operations[0].operation"
        );
        assert!(message.contains("Cray-2"), "{message}");
    }

    #[test]
    fn builtins_are_checked_where_they_are_used() {
        let text = CKE_CLUSTER_YML.replace(
            r#"repair_command: ["sh", "-c", "touch /tmp/mtest-repair-$1", "repair"]"#,
            r#"repair_command: ["@power-cycle"]"#,
        );
        let c = load(&text).unwrap().config;
        assert_eq!(
            c.operation_for("Cray-1", "unreachable")
                .unwrap()
                .repair_steps[0]
                .repair_command,
            CommandSpec::Builtin(Builtin::PowerCycle)
        );
        let (key, message) = err_key(&CKE_CLUSTER_YML.replace(
            r#"repair_command: ["sh", "-c", "touch /tmp/mtest-repair-$1", "repair"]"#,
            r#"repair_command: ["@reboot-now"]"#,
        ));
        assert_eq!(
            key,
            "repair.repair_procedures[0].repair_operations[0].repair_steps[0].repair_command[0]"
        );
        assert!(message.contains("unknown built-in"), "{message}");
        // Agent steps: repair steps only, with their arguments checked.
        let step = |cmd: &str| {
            CKE_CLUSTER_YML.replace(
                r#"repair_command: ["sh", "-c", "touch /tmp/mtest-repair-$1", "repair"]"#,
                &format!("repair_command: {cmd}"),
            )
        };
        let loaded = load(&step(r#"["@restart-unit", "kubelet"]"#)).unwrap();
        // CKE's default 30 s is shorter than the agent's 60 s restart limit: said, not refused.
        assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
        assert!(
            loaded.warnings[0].starts_with("repair.repair_procedures[0].repair_operations[0].repair_steps[0].command_timeout_seconds: 30 s is shorter"),
            "{}",
            loaded.warnings[0]
        );
        let long = load(&step(
            "[\"@restart-unit\", \"kubelet\"]\n              command_timeout_seconds: 120",
        ))
        .unwrap();
        assert_eq!(long.warnings, Vec::<String>::new());
        let c = loaded.config;
        assert_eq!(
            c.operation_for("Cray-1", "unreachable")
                .unwrap()
                .repair_steps[0]
                .repair_command,
            CommandSpec::Agent(AgentStep::RestartUnit("kubelet".into()))
        );
        assert!(load(&step(r#"["@reboot"]"#)).is_ok());
        assert!(load(&step(r#"["@collect-diagnostics"]"#)).is_ok());
        let (_, message) = err_key(&step(r#"["@restart-unit"]"#));
        assert!(message.contains("exactly one unit"), "{message}");
        let (_, message) = err_key(&step(r#"["@restart-unit", "-kubelet"]"#));
        assert!(message.contains("not a unit name"), "{message}");
        let (_, message) = err_key(&step(r#"["@reboot", "now"]"#));
        assert!(message.contains("takes no arguments"), "{message}");
        let (_, message) = err_key(&CKE_CLUSTER_YML.replace(
            r#"health_check_command: ["sh", "-c", "test -f /tmp/mtest-repair-$1 && echo true", "health_check"]"#,
            r#"health_check_command: ["@reboot"]"#,
        ));
        assert!(
            message.contains("unknown built-in"),
            "a health check must not reboot: {message}"
        );
        let (_, message) = err_key(&CKE_CLUSTER_YML.replace(
            r#"repair_command: ["sh", "-c", "touch /tmp/mtest-repair-$1", "repair"]"#,
            r#"repair_command: ["@agent-healthy"]"#,
        ));
        assert!(message.contains("cannot be used here"), "{message}");
        assert!(
            message.contains("@restart-unit NAME, @reboot, @collect-diagnostics"),
            "the agent's steps are allowed in a repair command: {message}"
        );
        let text = CKE_CLUSTER_YML.replace(
            r#"health_check_command: ["sh", "-c", "test -f /tmp/mtest-repair-$1 && echo true", "health_check"]"#,
            r#"health_check_command: ["@agent-healthy"]"#,
        );
        assert!(load(&text).is_ok());
    }

    #[test]
    fn missing_repair_section_and_bad_yaml_are_errors() {
        let (key, _) = err_key("name: x\n");
        assert_eq!(key, "repair");
        assert!(matches!(
            load("repair: [\n"),
            Err(RepairConfigError::Yaml { .. })
        ));
    }

    #[test]
    fn selector_expressions_render_in_api_syntax() {
        let text = CKE_CLUSTER_YML.replace(
            "  protected_job_pods:\n    matchLabels:\n      kind: protected\n",
            "  protected_job_pods:\n    matchExpressions:\n      - key: tier\n        operator: In\n        values: [a, b]\n      - key: gone\n        operator: DoesNotExist\n",
        );
        let c = load(&text).unwrap().config;
        assert_eq!(
            c.drain_options().protected_job_pods.as_deref(),
            Some("tier in (a,b),!gone")
        );
        let text = CKE_CLUSTER_YML.replace(
            "  protected_job_pods:\n    matchLabels:\n      kind: protected\n",
            "  protected_job_pods: {}\n",
        );
        let c = load(&text).unwrap().config;
        assert_eq!(
            c.drain_options().protected_job_pods.as_deref(),
            Some(""),
            "{{}} protects every job pod"
        );
    }
}
