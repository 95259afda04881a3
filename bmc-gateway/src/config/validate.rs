//! The rules a parsed [`Config`] must meet before the gateway uses it: absolute state
//! directory, non-zero limits, one entry per machine, plain host names, readable non-empty
//! password files, and per protocol the supported IPMI cipher suite or an explicit Redfish TLS
//! trust. Each refusal names its key and what to do. Parsing the file is in the parent module.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::{BmcProtocol, Config, ConfigError, loose_mode};

impl Config {
    pub(super) fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: String, detail: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            detail,
        };
        if self.state_dir.as_os_str().is_empty() || !self.state_dir.is_absolute() {
            return Err(bad(
                "state_dir".into(),
                format!(
                    "{:?} is not an absolute path; the request record must not depend on the working directory",
                    self.state_dir
                ),
            ));
        }
        if self.limits.action_timeout.is_zero() {
            return Err(bad(
                "limits.action_timeout".into(),
                "must be more than 0s".into(),
            ));
        }
        if self.limits.fence_timeout.is_zero() {
            return Err(bad(
                "limits.fence_timeout".into(),
                "must be more than 0s".into(),
            ));
        }
        let mut machines = HashSet::new();
        // Which entry each BMC (protocol, host, port and, for Redfish, system) belongs to.
        let mut seen: HashMap<(&str, String, u16, &str), (usize, &str)> = HashMap::new();
        for (i, b) in self.bmcs.iter().enumerate() {
            let key = |k: &str| format!("bmc[{i}].{k}");
            if b.machine.trim().is_empty() {
                return Err(bad(key("machine"), "must not be empty".into()));
            }
            if !machines.insert(b.machine.clone()) {
                return Err(bad(
                    key("machine"),
                    format!("machine {} is configured twice", b.machine),
                ));
            }
            if b.host.trim().is_empty() {
                return Err(bad(key("host"), "must not be empty".into()));
            }
            // A URL or `host:port` here made requests to "https://https//…" or "h:443:443".
            let ipv6 = b.host.parse::<std::net::Ipv6Addr>().is_ok();
            if b.host.contains('/') || (b.host.contains(':') && !ipv6) {
                return Err(bad(
                    key("host"),
                    format!(
                        "{:?} is not a host name or address: the port goes in port, \
                         http/https in redfish.scheme",
                        b.host
                    ),
                ));
            }
            if b.port == Some(0) {
                return Err(bad(key("port"), "0 is not a port".into()));
            }
            match b.read_password() {
                Err(e) => {
                    return Err(bad(
                        key("password_file"),
                        format!("cannot read {}: {e}", b.password_file.display()),
                    ));
                }
                // A file created but not yet written: every session would fail as a wrong
                // password, far from the cause.
                Ok(p) if p.is_empty() => {
                    return Err(bad(
                        key("password_file"),
                        format!(
                            "{} is empty: write the BMC user's password into it",
                            b.password_file.display()
                        ),
                    ));
                }
                Ok(_) => {}
            }
            if let Some(mode) = loose_mode(&b.password_file) {
                tracing::warn!(
                    bmc = %b.machine,
                    file = %b.password_file.display(),
                    mode = %format!("{mode:04o}"),
                    "BMC password file is readable or writable by others: chmod 600 it (owned by the gateway's user)"
                );
            }
            match b.protocol {
                BmcProtocol::Ipmi => {
                    if b.redfish.is_some() {
                        return Err(bad(
                            key("redfish"),
                            "a [bmc.redfish] table on an ipmi BMC".into(),
                        ));
                    }
                    let s = b.ipmi_settings();
                    if s.cipher_suite != 3 {
                        return Err(bad(
                            key("ipmi.cipher_suite"),
                            format!(
                                "cipher suite {} is not supported: only cipher suite 3 \
                                 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128) is; enable it on the BMC",
                                s.cipher_suite
                            ),
                        ));
                    }
                    if s.attempts == 0 || s.reply_timeout.is_zero() {
                        return Err(bad(
                            key("ipmi"),
                            "attempts must be at least 1 and reply_timeout more than 0s".into(),
                        ));
                    }
                }
                BmcProtocol::FenceAgent => {
                    if b.ipmi.is_some() || b.redfish.is_some() {
                        return Err(bad(
                            key(if b.ipmi.is_some() { "ipmi" } else { "redfish" }),
                            "a fence-agent BMC takes its settings in [bmc.agent] options".into(),
                        ));
                    }
                }
                BmcProtocol::Redfish => {
                    if b.ipmi.is_some() {
                        return Err(bad(
                            key("ipmi"),
                            "an [bmc.ipmi] table on a redfish BMC".into(),
                        ));
                    }
                    let Some(r) = &b.redfish else {
                        return Err(bad(
                            key("redfish"),
                            "a redfish BMC needs a [bmc.redfish] table with ca_file or insecure = true"
                                .into(),
                        ));
                    };
                    match r.scheme.as_str() {
                        "https" => match (&r.ca_file, r.insecure) {
                            (Some(_), true) => {
                                return Err(bad(
                                    key("redfish.insecure"),
                                    "set either ca_file or insecure = true, not both".into(),
                                ));
                            }
                            (None, false) => {
                                return Err(bad(
                                    key("redfish.ca_file"),
                                    "HTTPS needs a CA file to trust, or an explicit insecure = true"
                                        .into(),
                                ));
                            }
                            (Some(ca), false) => {
                                let pem = protocol::file::read_regular(ca).map_err(|e| {
                                    bad(
                                        key("redfish.ca_file"),
                                        format!("cannot read {}: {e}", ca.display()),
                                    )
                                })?;
                                // Found only when the client was built, as "BMC … sent an
                                // unexpected answer to TLS configuration": no BMC was asked.
                                if let Err(e) = crate::redfish_tls::ca_roots(&pem) {
                                    return Err(bad(
                                        key("redfish.ca_file"),
                                        format!("{}: {e}", ca.display()),
                                    ));
                                }
                            }
                            (None, true) => {}
                        },
                        // A CA file or `insecure` says the operator expects TLS: plain
                        // HTTP would send the credentials in clear text instead.
                        "http" if r.ca_file.is_some() || r.insecure => {
                            return Err(bad(
                                key("redfish.scheme"),
                                "\"http\" uses no TLS, yet ca_file or insecure is set; \
                                 use scheme = \"https\" (the default), or drop them for plain HTTP"
                                    .into(),
                            ));
                        }
                        "http" => {}
                        other => {
                            return Err(bad(
                                key("redfish.scheme"),
                                format!("{other:?} is not https or http"),
                            ));
                        }
                    }
                    if !matches!(r.auth.as_str(), "basic" | "session" | "auto") {
                        return Err(bad(
                            key("redfish.auth"),
                            format!("{:?} is not basic, session or auto", r.auth),
                        ));
                    }
                    if r.system.is_empty() || r.system.contains('/') {
                        return Err(bad(
                            key("redfish.system"),
                            "a system id (no '/') or \"discover\"".into(),
                        ));
                    }
                    if r.request_timeout.is_zero() {
                        return Err(bad(
                            key("redfish.request_timeout"),
                            "must be more than 0s".into(),
                        ));
                    }
                }
            }
            // Two machines on one BMC (a copied [[bmc]] table whose host was not changed): a
            // fence of the one would power off the other and read it off, and the first,
            // still running, would be released.
            let system = match (&b.redfish, &b.agent) {
                (Some(r), _) => r.system.as_str(),
                (_, Some(a)) => a
                    .options
                    .get("systems_uri")
                    .or(a.options.get("systems-uri"))
                    .map_or("", |s| s.as_str()),
                _ => "",
            };
            let at = (
                b.protocol.as_str(),
                b.host.to_ascii_lowercase(),
                b.port(),
                system,
            );
            if let Some((j, other)) = seen.insert(at, (i, b.machine.as_str())) {
                let what = match b.protocol {
                    BmcProtocol::Ipmi | BmcProtocol::FenceAgent => b.address(),
                    BmcProtocol::Redfish => {
                        format!("{}:{} system {system}", b.host, b.port())
                    }
                };
                return Err(bad(
                    key("host"),
                    format!(
                        "{what} is also bmc[{j}]'s (machine {other}): one BMC powers one \
                         machine, and a fence of {} would power off {other}; fix host or port \
                         (or redfish.system)",
                        b.machine
                    ),
                ));
            }
        }
        Ok(())
    }
}
