//! Machine records and the inventory file.
//!
//! A machine is keyed by its address (as in CKE) and carries hostname (which must equal the
//! name in its node certificate), serial, rack, role, machine type and labels. Records come
//! from the inventory file named in the config, from `coordinatorctl machines add/import`,
//! and, without a type, from hellos of unknown hosts.
//!
//! The inventory file is TOML (`[[machines]]` tables) or YAML (a `machines:` list, or a bare
//! list) when its name ends in `.yaml`/`.yml`. Unknown keys are errors. This module parses
//! and validates; [`crate::fleet`] owns the live registry and its persistence.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use protocol::admin::machines::MachineSpec;
use serde::{Deserialize, Serialize};

/// Where a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordSource {
    /// The inventory file.
    Inventory,
    /// `coordinatorctl machines add` or `import`.
    Admin,
    /// A hello from a host no record names (awaiting registration).
    Agent,
}

impl RecordSource {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordSource::Inventory => "inventory",
            RecordSource::Admin => "admin",
            RecordSource::Agent => "agent",
        }
    }

    /// Parses a stored name; unknown names read as `admin`.
    pub fn parse(s: &str) -> Self {
        match s {
            "inventory" => RecordSource::Inventory,
            "agent" => RecordSource::Agent,
            _ => RecordSource::Admin,
        }
    }
}

impl fmt::Display for RecordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is registered about one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRecord {
    /// Address: the key.
    pub address: String,
    /// Hostname; equals the name in the node's certificate.
    pub hostname: String,
    /// Serial number.
    pub serial: String,
    /// Rack.
    pub rack: String,
    /// Role (e.g. `cs`, `ss`).
    pub role: String,
    /// Machine type, selecting the repair procedure; `None` while awaiting registration.
    pub machine_type: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Origin.
    pub source: RecordSource,
}

impl MachineRecord {
    /// The wire form (an unregistered machine's type is empty).
    pub fn to_spec(&self) -> MachineSpec {
        MachineSpec {
            address: self.address.clone(),
            hostname: self.hostname.clone(),
            serial: self.serial.clone(),
            rack: self.rack.clone(),
            role: self.role.clone(),
            machine_type: self.machine_type.clone().unwrap_or_default(),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// Builds and validates a registered record from its wire form.
    pub fn from_spec(spec: &MachineSpec, source: RecordSource) -> Result<Self, InventoryError> {
        let entry = InventoryEntry {
            address: spec.address.clone(),
            hostname: spec.hostname.clone(),
            serial: spec.serial.clone(),
            rack: spec.rack.clone(),
            role: spec.role.clone(),
            machine_type: spec.machine_type.clone(),
            labels: spec.labels.iter().cloned().collect(),
        };
        entry.into_record(source)
    }
}

/// Why a record or inventory file was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The file could not be read.
    #[error("cannot read inventory {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file does not parse (the message names the key).
    #[error("inventory {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A record is invalid.
    #[error("machine {address:?}: {message}")]
    Invalid {
        /// The record's address as given.
        address: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// Two records in one batch share an address or hostname.
    #[error(
        "{what} {value:?} appears more than once (machines {first} and {second}, counted from 1)"
    )]
    Duplicate {
        /// `address` or `hostname`.
        what: &'static str,
        /// The value.
        value: String,
        /// Position of its first record in the batch, from 1.
        first: usize,
        /// Position of the record that repeats it, from 1.
        second: usize,
    },
}

impl InventoryError {
    /// Never: the input must be fixed.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// The longest machine type, rack and role, in characters: a name's length, as for a
/// hostname (253). Generous for any naming scheme; a value of thousands of characters is a
/// mistake (a pasted file, a runaway script) that would stretch every table and journal line.
pub const MAX_NAME_CHARS: usize = 253;

/// The longest serial number, in characters. Vendors' serials and asset tags are tens of
/// characters; 253 leaves room for any composite asset id.
pub const MAX_SERIAL_CHARS: usize = 253;

/// The longest label key, in characters: the longest Kubernetes label key (a 253-character
/// DNS prefix, `/`, a 63-character name), so node labels can be copied as they are.
pub const MAX_LABEL_KEY_CHARS: usize = 317;

/// The longest label value, in characters: as long as a pause reason, room for a sentence.
pub const MAX_LABEL_VALUE_CHARS: usize = 1000;

/// The start of a long value, quoted, for an error that must not repeat all of it.
fn preview(v: &str) -> String {
    const SHOWN: usize = 20;
    if v.chars().count() <= SHOWN {
        format!("{v:?}")
    } else {
        let start: String = v.chars().take(SHOWN).collect();
        format!("{:?}", format!("{start}…"))
    }
}

/// One machine as written in an inventory file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryEntry {
    /// IP address.
    pub address: String,
    /// Hostname.
    pub hostname: String,
    /// Serial.
    #[serde(default)]
    pub serial: String,
    /// Rack.
    #[serde(default)]
    pub rack: String,
    /// Role.
    #[serde(default)]
    pub role: String,
    /// Machine type (also accepted as `type`).
    #[serde(alias = "type")]
    pub machine_type: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl InventoryEntry {
    /// Validates and converts.
    pub fn into_record(self, source: RecordSource) -> Result<MachineRecord, InventoryError> {
        let invalid = |message: String| InventoryError::Invalid {
            address: self.address.clone(),
            message,
        };
        let ip: IpAddr = self
            .address
            .parse()
            .map_err(|_| invalid("address must be an IPv4 or IPv6 address".into()))?;
        protocol::identity::validate_hostname(&self.hostname)
            .map_err(|e| invalid(e.to_string()))?;
        if self.machine_type.trim().is_empty() {
            return Err(invalid(
                "machine type is required: it selects the repair procedure".into(),
            ));
        }
        let texts = [
            ("serial", self.serial.as_str(), MAX_SERIAL_CHARS),
            ("rack", self.rack.as_str(), MAX_NAME_CHARS),
            ("role", self.role.as_str(), MAX_NAME_CHARS),
            ("machine type", self.machine_type.as_str(), MAX_NAME_CHARS),
        ];
        let labels = self.labels.iter().flat_map(|(k, v)| {
            [
                ("label key", k.as_str(), MAX_LABEL_KEY_CHARS),
                ("label value", v.as_str(), MAX_LABEL_VALUE_CHARS),
            ]
        });
        for (what, v, max) in texts.into_iter().chain(labels) {
            // Counted first: a value of a million characters is not quoted back whole.
            let n = v.chars().count();
            if n > max {
                return Err(invalid(format!(
                    "{what} {} is {n} characters long; the limit is {max}",
                    preview(v)
                )));
            }
            // A control character would break a table row or reach an operator's terminal
            // as an escape sequence.
            if v.chars().any(char::is_control) {
                return Err(invalid(format!(
                    "{what} {v:?} contains a control character (a newline, a tab, an escape, …)"
                )));
            }
        }
        for k in self.labels.keys() {
            if k.is_empty() || k.contains('=') {
                return Err(invalid(format!(
                    "label key {k:?} must be non-empty, without '='"
                )));
            }
        }
        Ok(MachineRecord {
            // Canonical form, so other spellings (`::0001`, an IPv4-mapped `::ffff:10.0.0.1`)
            // cannot make two records of one machine.
            address: ip.to_canonical().to_string(),
            hostname: self.hostname,
            serial: self.serial,
            rack: self.rack,
            role: self.role,
            machine_type: Some(self.machine_type),
            labels: self.labels,
            source,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryDoc {
    #[serde(default)]
    machines: Vec<InventoryEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum YamlDoc {
    List(Vec<InventoryEntry>),
    Doc(InventoryDoc),
}

/// True when a YAML inventory's first content line is a list item (`- address: …`), the
/// bare-list form, rather than `machines:`.
fn yaml_is_bare_list(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && *l != "---")
        .is_some_and(|l| l == "-" || l.starts_with("- "))
}

/// Parses inventory text; YAML when `path` ends in `.yaml`/`.yml`, TOML otherwise.
pub fn parse_inventory(
    text: &str,
    path: &Path,
    source: RecordSource,
) -> Result<Vec<MachineRecord>, InventoryError> {
    let parse = |message: String| InventoryError::Parse {
        path: path.to_path_buf(),
        message,
    };
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    let entries = if yaml {
        if text.trim().is_empty() {
            Vec::new()
        } else {
            match serde_saphyr::from_str::<YamlDoc>(text) {
                Ok(YamlDoc::List(l)) => l,
                Ok(YamlDoc::Doc(d)) => d.machines,
                // The untagged error hides the key and the line: parse again as the form
                // the file is written in, whose error names them.
                Err(_) if yaml_is_bare_list(text) => {
                    serde_saphyr::from_str::<Vec<InventoryEntry>>(text)
                        .map_err(|e| parse(e.to_string()))?
                }
                Err(_) => {
                    serde_saphyr::from_str::<InventoryDoc>(text)
                        .map_err(|e| parse(e.to_string()))?
                        .machines
                }
            }
        }
    } else {
        toml::from_str::<InventoryDoc>(text)
            .map_err(|e| parse(e.to_string().trim_end().to_string()))?
            .machines
    };
    // Name the file and the entry: an inventory of hundreds of machines is fixed by line.
    let records = entries
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            e.into_record(source)
                .map_err(|err| parse(format!("machine {} (counted from 1): {err}", i + 1)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_unique(&records).map_err(|err| parse(err.to_string()))?;
    Ok(records)
}

/// Reads and parses an inventory file. The coordinator's own inventory (`source` is
/// [`RecordSource::Inventory`]) must be a regular file, so a FIFO or a device named by
/// mistake fails the start at once instead of hanging it; `coordinatorctl machines import`
/// also takes a pipe (`import /dev/stdin`).
pub fn load_inventory(
    path: &Path,
    source: RecordSource,
) -> Result<Vec<MachineRecord>, InventoryError> {
    let read = match source {
        RecordSource::Inventory => protocol::file::read_regular_to_string(path),
        _ => std::fs::read_to_string(path),
    };
    let text = read.map_err(|e| InventoryError::Read {
        path: path.to_path_buf(),
        source: e,
    })?;
    parse_inventory(&text, path, source)
}

/// Refuses a batch in which an address or hostname repeats.
pub fn check_unique(records: &[MachineRecord]) -> Result<(), InventoryError> {
    let mut addrs = std::collections::HashMap::new();
    let mut hosts = std::collections::HashMap::new();
    for (i, r) in records.iter().enumerate() {
        if let Some(&first) = addrs.get(r.address.as_str()) {
            return Err(InventoryError::Duplicate {
                what: "address",
                value: r.address.clone(),
                first: first + 1,
                second: i + 1,
            });
        }
        addrs.insert(r.address.as_str(), i);
        if let Some(&first) = hosts.get(r.hostname.as_str()) {
            return Err(InventoryError::Duplicate {
                what: "hostname",
                value: r.hostname.clone(),
                first: first + 1,
                second: i + 1,
            });
        }
        hosts.insert(r.hostname.as_str(), i);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_inventory_parses() {
        let text = r#"
[[machines]]
address = "10.0.0.1"
hostname = "web-1"
serial = "S1"
rack = "r1"
role = "cs"
machine_type = "qemu"
labels = { zone = "a" }

[[machines]]
address = "10.0.0.2"
hostname = "web-2"
type = "qemu"
"#;
        let r = parse_inventory(text, Path::new("inv.toml"), RecordSource::Inventory).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].labels["zone"], "a");
        assert_eq!(r[1].machine_type.as_deref(), Some("qemu"));
        assert_eq!(r[1].serial, "");
    }

    #[test]
    fn yaml_inventory_parses_both_forms() {
        let list = "- address: 10.0.0.1\n  hostname: a\n  machine_type: t\n";
        let doc = "machines:\n  - address: 10.0.0.1\n    hostname: a\n    type: t\n    labels:\n      k: v\n";
        for text in [list, doc] {
            let r = parse_inventory(text, Path::new("inv.yaml"), RecordSource::Inventory).unwrap();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].hostname, "a");
        }
    }

    #[test]
    fn a_bad_yaml_inventory_is_refused_naming_what_is_wrong_in_its_own_form() {
        let list = "# fleet\n---\n- address: 10.0.0.1\n  hostname: a\n";
        let doc = "machines:\n  - address: 10.0.0.1\n    hostname: a\n";
        for text in [list, doc] {
            let e = parse_inventory(text, Path::new("inv.yaml"), RecordSource::Inventory)
                .unwrap_err()
                .to_string();
            assert!(e.contains("machine_type"), "{text}: {e}");
        }
        let e = parse_inventory(
            "- address: 10.0.0.1\n  hostname: a\n  machine_type: t\n  rak: r\n",
            Path::new("inv.yml"),
            RecordSource::Inventory,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rak"), "{e}");
    }

    #[test]
    fn unknown_key_and_bad_values_are_refused() {
        let e = parse_inventory(
            "[[machines]]\naddress = \"10.0.0.1\"\nhostname = \"a\"\nmachine_type = \"t\"\nrak = \"r\"\n",
            Path::new("inv.toml"),
            RecordSource::Inventory,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rak"), "{e}");
        let e = parse_inventory(
            "[[machines]]\naddress = \"web\"\nhostname = \"a\"\nmachine_type = \"t\"\n",
            Path::new("inv.toml"),
            RecordSource::Inventory,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("IPv4"), "{e}");
        let e = parse_inventory(
            "[[machines]]\naddress = \"10.0.0.1\"\nhostname = \"a\"\nmachine_type = \"t\"\n[[machines]]\naddress = \"10.0.0.2\"\nhostname = \"a\"\nmachine_type = \"t\"\n",
            Path::new("inv.toml"),
            RecordSource::Inventory,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "inventory inv.toml: hostname \"a\" appears more than once (machines 1 and 2"
            ),
            "{e}"
        );
        let e = parse_inventory(
            "[[machines]]\naddress = \"10.0.0.1\"\nhostname = \"a\"\nmachine_type = \"t\"\n[[machines]]\naddress = \"10.0.0.2\"\nhostname = \"b\"\nmachine_type = \" \"\n",
            Path::new("inv.toml"),
            RecordSource::Inventory,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("inventory inv.toml: machine 2 (counted from 1): machine \"10.0.0.2\": machine type is required"),
            "{e}"
        );
    }

    #[test]
    fn spec_round_trip() {
        let spec = MachineSpec {
            address: "::1".into(),
            hostname: "h".into(),
            serial: "s".into(),
            rack: "r".into(),
            role: "cs".into(),
            machine_type: "t".into(),
            labels: vec![("a".into(), "b".into())],
        };
        let r = MachineRecord::from_spec(&spec, RecordSource::Admin).unwrap();
        assert_eq!(r.to_spec(), spec);
    }

    #[test]
    fn other_spellings_of_an_address_are_one_machine_and_control_characters_are_refused() {
        let spec = |address: &str| MachineSpec {
            address: address.into(),
            hostname: "h".into(),
            serial: "s".into(),
            rack: "r".into(),
            role: "cs".into(),
            machine_type: "t".into(),
            labels: vec![],
        };
        for a in ["10.0.1.11", "::ffff:10.0.1.11"] {
            let r = MachineRecord::from_spec(&spec(a), RecordSource::Admin).unwrap();
            assert_eq!(r.address, "10.0.1.11", "{a}");
        }
        let r = MachineRecord::from_spec(&spec("::0001"), RecordSource::Admin).unwrap();
        assert_eq!(r.address, "::1");
        for (field, set) in [
            (
                "rack",
                (|s: &mut MachineSpec| s.rack = "r\u{1b}[31mRED".into()) as fn(&mut MachineSpec),
            ),
            ("role", |s: &mut MachineSpec| s.role = "line1\nline2".into()),
            ("serial", |s: &mut MachineSpec| s.serial = "a\tb".into()),
            ("label value", |s: &mut MachineSpec| {
                s.labels = vec![("k".into(), "v\r".into())]
            }),
        ] {
            let mut sp = spec("10.0.0.1");
            set(&mut sp);
            let e = MachineRecord::from_spec(&sp, RecordSource::Admin)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field) && e.contains("control character"), "{e}");
        }
    }

    #[test]
    fn over_long_fields_are_refused_naming_the_field_and_the_limit() {
        let spec = MachineSpec {
            address: "10.0.2.1".into(),
            hostname: "ok-1".into(),
            serial: "s".repeat(MAX_SERIAL_CHARS),
            rack: "r".repeat(MAX_NAME_CHARS),
            role: "o".repeat(MAX_NAME_CHARS),
            machine_type: "é".repeat(MAX_NAME_CHARS),
            labels: vec![(
                "k".repeat(MAX_LABEL_KEY_CHARS),
                "v".repeat(MAX_LABEL_VALUE_CHARS),
            )],
        };
        MachineRecord::from_spec(&spec, RecordSource::Admin)
            .expect("at the limits (in characters)");
        type Set = fn(&mut MachineSpec);
        let cases: [(&str, usize, Set); 6] = [
            ("machine type", MAX_NAME_CHARS, |s| {
                s.machine_type = "t".repeat(100_000)
            }),
            ("rack", MAX_NAME_CHARS, |s| s.rack.push('r')),
            ("role", MAX_NAME_CHARS, |s| s.role.push('o')),
            ("serial", MAX_SERIAL_CHARS, |s| s.serial.push('s')),
            ("label key", MAX_LABEL_KEY_CHARS, |s| {
                s.labels[0].0.push('k')
            }),
            ("label value", MAX_LABEL_VALUE_CHARS, |s| {
                s.labels[0].1.push('v')
            }),
        ];
        for (field, max, set) in cases {
            let mut sp = spec.clone();
            set(&mut sp);
            let e = MachineRecord::from_spec(&sp, RecordSource::Admin)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("machine \"10.0.2.1\": {field} \""))
                    && e.contains(&format!("characters long; the limit is {max}")),
                "{e}"
            );
            assert!(e.len() < 200, "the value is not repeated whole: {e}");
        }
        // The inventory file read at start goes through the same check.
        let text = format!(
            "[[machines]]\naddress = \"10.0.2.1\"\nhostname = \"ok-1\"\ntype = \"{}\"\n",
            "t".repeat(254)
        );
        let e = parse_inventory(&text, Path::new("inv.toml"), RecordSource::Inventory)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("machine 1 (counted from 1)")
                && e.contains("machine type \"tttttttttttttttttttt…\" is 254 characters long; the limit is 253"),
            "{e}"
        );
    }
}
