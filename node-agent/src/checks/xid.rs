//! NVIDIA Xid errors: parsing the driver's kernel log line and classifying the code. Pure;
//! reading the log is `gpu`'s job.
//!
//! The driver writes `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`
//! for every Xid. The default classification follows the "recommended action" column of
//! NVIDIA's published Xid catalogue: what asks for a GPU reset or a node reboot fails the
//! check, what is known to come from an application (a bad kernel launch, an MMU fault in
//! user code) is ignored, and what tells of wear (ECC page retirement) warns.

use std::collections::BTreeMap;

use serde::Deserialize;

/// What an Xid asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XidAction {
    /// An application error (or noise): not reported as a problem.
    Ignore,
    /// Worth seeing (wear, a contained error): `warn`.
    Warn,
    /// The GPU needs a reset: `fail`.
    Reset,
    /// The node needs a reboot: `fail`.
    Reboot,
}

impl XidAction {
    /// Lower-case name, as in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            XidAction::Ignore => "ignore",
            XidAction::Warn => "warn",
            XidAction::Reset => "reset",
            XidAction::Reboot => "reboot",
        }
    }
}

/// The defaults, from NVIDIA's Xid catalogue (code, action, what it means).
const DEFAULTS: [(u32, XidAction, &str); 22] = [
    (
        13,
        XidAction::Ignore,
        "graphics engine exception (application)",
    ),
    (31, XidAction::Ignore, "GPU memory page fault (application)"),
    (
        43,
        XidAction::Ignore,
        "GPU stopped processing (application)",
    ),
    (
        45,
        XidAction::Ignore,
        "preemptive cleanup after an earlier error",
    ),
    (48, XidAction::Reboot, "double-bit ECC error"),
    (61, XidAction::Reset, "internal micro-controller breakpoint"),
    (62, XidAction::Reset, "internal micro-controller halt"),
    (
        63,
        XidAction::Warn,
        "ECC page retirement or row remapping recorded",
    ),
    (
        64,
        XidAction::Reset,
        "ECC page retirement or row remapping failed",
    ),
    (68, XidAction::Warn, "video processor exception"),
    (
        69,
        XidAction::Ignore,
        "graphics engine class error (application)",
    ),
    (74, XidAction::Reset, "NVLink error"),
    (79, XidAction::Reboot, "GPU has fallen off the bus"),
    (92, XidAction::Warn, "high single-bit ECC error rate"),
    (
        94,
        XidAction::Warn,
        "contained ECC error (the application was stopped)",
    ),
    (95, XidAction::Reset, "uncontained ECC error"),
    (109, XidAction::Warn, "context switch timeout"),
    (119, XidAction::Reboot, "GSP RPC timeout"),
    (120, XidAction::Reboot, "GSP error"),
    (121, XidAction::Warn, "C2C link corrected error"),
    (140, XidAction::Reset, "unrecovered ECC error"),
    (154, XidAction::Reboot, "GPU recovery action changed"),
];

/// Xid code → action, with an action for codes it does not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidTable {
    codes: BTreeMap<u32, XidAction>,
    /// What an Xid not in the table asks for.
    pub unknown: XidAction,
}

impl Default for XidTable {
    fn default() -> Self {
        Self {
            codes: DEFAULTS.iter().map(|(c, a, _)| (*c, *a)).collect(),
            // A new driver's new Xid is seen, not failed on: the catalogue grows, and an
            // operator adds what their fleet treats as fatal.
            unknown: XidAction::Warn,
        }
    }
}

impl XidTable {
    /// Sets the action of `code`.
    pub fn set(&mut self, code: u32, action: XidAction) {
        self.codes.insert(code, action);
    }

    /// The action `code` asks for.
    pub fn action(&self, code: u32) -> XidAction {
        self.codes.get(&code).copied().unwrap_or(self.unknown)
    }
}

/// What the catalogue calls `code`, when it is one of the defaults.
pub fn meaning(code: u32) -> Option<&'static str> {
    DEFAULTS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, _, m)| *m)
}

/// One Xid line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// The GPU's PCI address as the driver prints it (`0000:3b:00`).
    pub gpu: String,
    /// The Xid number.
    pub code: u32,
    /// The rest of the line (pid, name, description), trimmed.
    pub text: String,
}

/// Parses the message part of a kernel log record; `None` when it is not an Xid line.
pub fn parse(message: &str) -> Option<Xid> {
    let rest = &message[message.find("NVRM: Xid (")? + "NVRM: Xid (".len()..];
    let (inside, rest) = rest.split_once("):")?;
    let gpu = inside.strip_prefix("PCI:").unwrap_or(inside).trim();
    if gpu.is_empty() || gpu.len() > 32 {
        return None;
    }
    let rest = rest.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: u32 = rest[..digits].parse().ok()?;
    let text = rest[digits..].trim_start_matches(',').trim();
    Some(Xid {
        gpu: gpu.to_string(),
        code,
        text: text.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_lines_of_old_and_new_drivers_parse() {
        let x = parse(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!((x.gpu.as_str(), x.code), ("0000:3b:00", 79));
        assert!(x.text.starts_with("pid=1234"), "{x:?}");
        let x =
            parse("NVRM: Xid (PCI:0000:86:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0)")
                .unwrap();
        assert_eq!((x.gpu.as_str(), x.code), ("0000:86:00", 13));
        assert_eq!(parse("NVRM: GPU at PCI:0000:3b:00: GPU-uuid"), None);
        assert_eq!(parse("NVRM: Xid (PCI:0000:3b:00): abc"), None);
        assert_eq!(parse("eth0: link up"), None);
    }

    #[test]
    fn defaults_follow_the_catalogue() {
        let t = XidTable::default();
        assert_eq!(t.action(79), XidAction::Reboot);
        assert_eq!(t.action(48), XidAction::Reboot);
        assert_eq!(t.action(74), XidAction::Reset);
        assert_eq!(t.action(13), XidAction::Ignore);
        assert_eq!(t.action(63), XidAction::Warn);
        assert_eq!(t.action(4242), XidAction::Warn);
        assert_eq!(meaning(79), Some("GPU has fallen off the bus"));
    }
}
