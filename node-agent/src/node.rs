//! What the agent says about its server in its hello: hostname, DMI serial, non-loopback
//! addresses, agent version and boot id, all read under the configured root.
//!
//! Addresses come from `/proc/net/fib_trie` (IPv4 `/32 host LOCAL` entries) and
//! `/proc/net/if_inet6` (IPv6), so no netlink socket is needed. Loopback and IPv6
//! link-local addresses are left out: they identify nothing across machines.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use protocol::messages::AgentHello;

use crate::checks::base::{read_trimmed, under_root};

/// Errors reading node facts that the agent cannot work without.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The hostname could not be determined.
    #[error("cannot read hostname from {path}: {source}; set `hostname` in the config")]
    Hostname {
        /// The file.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The boot id could not be read.
    #[error("cannot read boot id from {path}: {source}")]
    BootId {
        /// The file.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

impl NodeError {
    /// Missing procfs files do not appear by waiting.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// The kernel hostname (`/proc/sys/kernel/hostname`), or the override.
pub fn hostname(root: &Path, over: Option<&str>) -> Result<String, NodeError> {
    if let Some(h) = over {
        return Ok(h.to_string());
    }
    let path = under_root(root, "/proc/sys/kernel/hostname");
    read_trimmed(&path).map_err(|source| NodeError::Hostname { path, source })
}

/// The current boot id.
pub fn boot_id(root: &Path) -> Result<String, NodeError> {
    let path = under_root(root, "/proc/sys/kernel/random/boot_id");
    read_trimmed(&path).map_err(|source| NodeError::BootId { path, source })
}

/// The boot id file, kept open for the reports (one `pread` each on procfs; see
/// `checks::kept`). Read every report rather than once: it cannot change under a running
/// agent on a real machine, but the tests' fixture machines "reboot" under a running agent by
/// writing a new one.
#[derive(Debug)]
pub struct BootIdFile {
    file: crate::checks::kept::KeptFile,
}

impl BootIdFile {
    /// The boot id file under `root`, opened on the first read.
    pub fn new(root: &Path) -> Self {
        Self {
            file: crate::checks::kept::KeptFile::new(under_root(
                root,
                "/proc/sys/kernel/random/boot_id",
            )),
        }
    }

    /// The current boot id.
    pub fn read(&mut self) -> Result<String, NodeError> {
        self.file
            .read_trimmed()
            .map_err(|source| NodeError::BootId {
                path: self.file.path().to_path_buf(),
                source,
            })
    }
}

/// The DMI product serial, empty when unreadable (VMs, no permission).
pub fn serial(root: &Path) -> String {
    read_trimmed(&under_root(root, "/sys/class/dmi/id/product_serial")).unwrap_or_default()
}

/// Local IPv4 host addresses from a `fib_trie` dump: an address line (`|-- a.b.c.d`)
/// followed by `/32 host LOCAL`. Deduplicated (the trie lists them in several tables).
pub fn parse_fib_trie(text: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']);
        let t = t.trim();
        if let Some(rest) = line.trim().strip_prefix("|--") {
            last = rest.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(a) = last
                && !out.contains(&a)
            {
                out.push(a);
            }
        } else if line.trim().starts_with("+--") {
            last = None;
        }
    }
    out
}

/// IPv6 addresses from `if_inet6` lines (`<32 hex> <ifindex> <prefix> <scope> <flags> <name>`).
pub fn parse_if_inet6(text: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|l| {
            let hex = l.split_ascii_whitespace().next()?;
            if hex.len() != 32 {
                return None;
            }
            let n = u128::from_str_radix(hex, 16).ok()?;
            Some(Ipv6Addr::from(n))
        })
        .collect()
}

/// The node's addresses worth reporting: no loopback, no IPv6 link-local, no unspecified.
pub fn addresses(root: &Path) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    if let Ok(t) = std::fs::read_to_string(under_root(root, "/proc/net/fib_trie")) {
        out.extend(
            parse_fib_trie(&t)
                .into_iter()
                .filter(|a| !a.is_loopback() && !a.is_unspecified())
                .map(IpAddr::V4),
        );
    }
    if let Ok(t) = std::fs::read_to_string(under_root(root, "/proc/net/if_inet6")) {
        for a in parse_if_inet6(&t) {
            let link_local = (a.segments()[0] & 0xffc0) == 0xfe80;
            if !a.is_loopback()
                && !a.is_unspecified()
                && !link_local
                && !out.contains(&IpAddr::V6(a))
            {
                out.push(IpAddr::V6(a));
            }
        }
    }
    out
}

/// Builds the hello for this node.
pub fn hello(root: &Path, hostname_override: Option<&str>) -> Result<AgentHello, NodeError> {
    Ok(AgentHello {
        hostname: hostname(root, hostname_override)?,
        serial: serial(root),
        addresses: addresses(root),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        boot_id: boot_id(root)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit_fixture::NodeFixture;

    /// Excerpt of a real /proc/net/fib_trie.
    const REAL_TRIE: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.168.122.0/24 2 0 2
        +-- 192.168.122.0/28 2 0 2
           |-- 192.168.122.0
              /24 link UNICAST
           |-- 192.168.122.10
              /32 host LOCAL
        |-- 192.168.122.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
     +-- 192.168.122.0/24 2 0 2
           |-- 192.168.122.10
              /32 host LOCAL
";

    #[test]
    fn fib_trie_host_locals() {
        let a = parse_fib_trie(REAL_TRIE);
        assert_eq!(
            a,
            vec![
                Ipv4Addr::new(127, 0, 0, 1),
                Ipv4Addr::new(192, 168, 122, 10)
            ]
        );
    }

    #[test]
    fn if_inet6_lines() {
        let t = "00000000000000000000000000000001 01 80 10 80       lo\n\
                 fe80000000000000505400fffe123456 02 40 20 80     eth0\n\
                 20010db8000000000000000000000005 02 40 00 80     eth0\n";
        let a = parse_if_inet6(t);
        assert_eq!(a.len(), 3);
        assert_eq!(a[2], "2001:db8::5".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn hello_from_a_fixture() {
        let f = NodeFixture::builder("node-9")
            .serial("ABC123")
            .address("10.0.0.9".parse().unwrap())
            .address("2001:db8::9".parse().unwrap())
            .build()
            .unwrap();
        let h = hello(f.root(), None).unwrap();
        assert_eq!(h.hostname, "node-9");
        assert_eq!(h.serial, "ABC123");
        assert_eq!(h.boot_id, f.boot_id());
        let want: Vec<IpAddr> = vec!["10.0.0.9".parse().unwrap(), "2001:db8::9".parse().unwrap()];
        assert_eq!(h.addresses, want);
        assert_eq!(hello(f.root(), Some("other")).unwrap().hostname, "other");
    }

    #[test]
    fn missing_hostname_is_an_error_with_the_path() {
        let f = NodeFixture::builder("x").build().unwrap();
        std::fs::remove_file(f.path_of("proc/sys/kernel/hostname")).unwrap();
        let e = hello(f.root(), None).unwrap_err();
        assert!(e.to_string().contains("proc/sys/kernel/hostname"), "{e}");
        // Serial and addresses are optional.
        std::fs::remove_file(f.path_of("sys/class/dmi/id/product_serial")).unwrap();
        assert_eq!(serial(f.root()), "");
    }
}
