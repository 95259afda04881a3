//! Identities carried in certificates as SPIFFE-style URI SANs:
//! `spiffe://<trust-domain>/<role>/<name>`.
//!
//! The certificate, never a field inside a message, says who is speaking. This module only
//! parses and formats identities; extracting them from a peer's certificate lives in
//! `transport`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What kind of component an identity names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    /// A server running node-agent; the name is its hostname.
    Node,
    /// A rack's bmc-gateway; the name is the rack.
    Gateway,
    /// A coordinator instance.
    Coordinator,
    /// A person or script using the admin API.
    Admin,
}

impl Role {
    /// The path segment used in the URI.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Gateway => "gateway",
            Role::Coordinator => "coordinator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "node" => Ok(Role::Node),
            "gateway" => Ok(Role::Gateway),
            "coordinator" => Ok(Role::Coordinator),
            "admin" => Ok(Role::Admin),
            other => Err(IdentityError::UnknownRole(other.to_string())),
        }
    }
}

/// A parsed identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The fleet's trust domain, e.g. `fleet.example`.
    pub trust_domain: String,
    /// The component's role.
    pub role: Role,
    /// Hostname, rack, coordinator name or user.
    pub name: String,
}

/// Why an identity string or certificate was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not of the form `spiffe://<trust-domain>/<role>/<name>`.
    #[error("identity {0:?} is not of the form spiffe://<trust-domain>/<role>/<name>")]
    Malformed(String),
    /// The role segment is not one of node, gateway, coordinator, admin.
    #[error("unknown role {0:?}: expected node, gateway, coordinator or admin")]
    UnknownRole(String),
    /// A name or trust domain contains characters outside `[A-Za-z0-9._-]` or is empty.
    #[error("invalid {what} {value:?}: use 1-253 characters of letters, digits, '.', '-', '_'")]
    InvalidName {
        /// Which part was invalid.
        what: &'static str,
        /// The offending value.
        value: String,
    },
    /// A host's name is not an RFC 1123 hostname.
    #[error("hostname {value:?} is not valid (RFC 1123): {why}")]
    NotAHostname {
        /// The offending value.
        value: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// The certificate could not be parsed.
    #[error("certificate could not be parsed: {0}")]
    BadCertificate(String),
    /// The certificate has no `spiffe://` URI SAN.
    #[error("certificate carries no spiffe:// URI SAN")]
    NoIdentity,
    /// The certificate has more than one `spiffe://` URI SAN, which would be ambiguous.
    #[error("certificate carries {0} spiffe:// URI SANs; exactly one is allowed")]
    Ambiguous(usize),
}

/// Checks a hostname-like name: what a node, rack, coordinator or user may be called.
pub fn validate_name(what: &'static str, value: &str) -> Result<(), IdentityError> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::InvalidName {
            what,
            value: value.to_string(),
        })
    }
}

/// Checks a host's name against RFC 1123: dot-separated labels of 1 to 63 letters, digits
/// and hyphens, none starting or ending with a hyphen, 253 characters at most. Kubernetes
/// node names and DNS hold machines to this, so an inventory or a node certificate must too.
pub fn validate_hostname(value: &str) -> Result<(), IdentityError> {
    let bad = |why| {
        Err(IdentityError::NotAHostname {
            value: value.to_string(),
            why,
        })
    };
    if value.is_empty() || value.len() > 253 {
        return bad("it must have 1 to 253 characters");
    }
    for label in value.split('.') {
        if label.is_empty() || label.len() > 63 {
            return bad("each dot-separated label must have 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("only letters, digits, hyphens and dots are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label must not start or end with a hyphen");
        }
    }
    Ok(())
}

impl Identity {
    /// Builds and validates an identity.
    pub fn new(trust_domain: &str, role: Role, name: &str) -> Result<Self, IdentityError> {
        validate_name("trust domain", trust_domain)?;
        validate_name("name", name)?;
        Ok(Self {
            trust_domain: trust_domain.to_string(),
            role,
            name: name.to_string(),
        })
    }

    /// The URI form, `spiffe://<trust-domain>/<role>/<name>`.
    pub fn uri(&self) -> String {
        format!("spiffe://{}/{}/{}", self.trust_domain, self.role, self.name)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

impl FromStr for Identity {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("spiffe://")
            .ok_or_else(|| IdentityError::Malformed(s.to_string()))?;
        let mut parts = rest.split('/');
        let (Some(td), Some(role), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(IdentityError::Malformed(s.to_string()));
        };
        Identity::new(td, role.parse()?, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_follow_rfc_1123() {
        for ok in ["node-1", "a", "web-2.rack-1.example", "N1"] {
            assert!(validate_hostname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "under_score",
            "-lead",
            "trail-",
            "a..b",
            &"x".repeat(64),
        ] {
            assert!(validate_hostname(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_every_role() {
        for (s, role) in [
            ("spiffe://fleet.test/node/web-1", Role::Node),
            ("spiffe://fleet.test/gateway/rack-a", Role::Gateway),
            ("spiffe://fleet.test/coordinator/c1", Role::Coordinator),
            ("spiffe://fleet.test/admin/alice", Role::Admin),
        ] {
            let id: Identity = s.parse().unwrap();
            assert_eq!(id.role, role);
            assert_eq!(id.trust_domain, "fleet.test");
            assert_eq!(id.uri(), s);
        }
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            "",
            "https://fleet.test/node/a",
            "spiffe://fleet.test/node",
            "spiffe://fleet.test/node/a/b",
            "spiffe:///node/a",
            "spiffe://fleet.test/node/",
            "spiffe://fleet.test/node/a b",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad:?} was accepted");
        }
        assert_eq!(
            "spiffe://fleet.test/root/a".parse::<Identity>(),
            Err(IdentityError::UnknownRole("root".into()))
        );
    }
}
