//! What the fence flow needs to know about a machine's crash dump, as one trait: the
//! registry of kdump notices ([`crate::kdump::Kdumps`]) implements it, [`NoKdump`] is the
//! view of a coordinator (or a test) that never hears of dumps.
//!
//! Plain reads, no I/O: the registry answers from memory.

use std::time::Duration;

use jiff::Timestamp;

/// What is known now of a machine's crash dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpSeen {
    /// No dump is known (none reported, or the machine has reported healthy since).
    None,
    /// The kdump initramfs said "dumping" at `started` (coordinator clock) and nothing
    /// since: the machine runs the dump kernel only.
    Dumping {
        /// When the "dumping" notice arrived.
        started: Timestamp,
        /// How long this machine's dump may take (`kdump_timeout`, per machine type).
        timeout: Duration,
    },
    /// The kdump initramfs said "dump done" at `at`.
    Done {
        /// When the "dump done" notice arrived.
        at: Timestamp,
    },
}

/// A machine's crash dump, as the fence flow and remediation read it.
pub trait KdumpView: Send + Sync {
    /// What is known now of the dump of the machine at `address`.
    fn dump(&self, address: &str) -> DumpSeen;
}

/// The view that never knows of a dump: flows always fence by power-off.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoKdump;

impl KdumpView for NoKdump {
    fn dump(&self, _address: &str) -> DumpSeen {
        DumpSeen::None
    }
}
