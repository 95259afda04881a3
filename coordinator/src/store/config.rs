//! `[store]`: which backend keeps the coordinator's state, and how to reach it.
//!
//! `backend = "sqlite"` (the default) keeps it in the file the top-level `database` key
//! names, as before this section existed. `backend = "etcd"` keeps it in an etcd cluster:
//! `endpoints`, the client's TLS files (`ca`, `cert`, `key`), a key `prefix` (several fleets
//! can share one etcd) and a `timeout` for each request. The etcd keys are read and checked
//! here, whatever the backend, so a typo is found before the day someone switches; with
//! `sqlite` they are not used. Building the etcd client is the etcd backend's job.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The default key prefix: every key of the coordinator's state is under it.
pub const DEFAULT_PREFIX: &str = "/fleetmend/";

/// How long one etcd request may take by default. etcd answers in milliseconds when
/// healthy and elects a new leader within a few seconds (its default election timeout is
/// 1 s); 5 s rides out one election without holding a repair step for long.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Which backend keeps the coordinator's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// SQLite on a local file (`database`); one coordinator per file.
    #[default]
    Sqlite,
    /// etcd (`endpoints`, …).
    Etcd,
}

impl Backend {
    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Etcd => "etcd",
        }
    }
}

/// The `[store]` section as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite` (default) or `etcd`.
    #[serde(default)]
    pub backend: Backend,
    /// etcd: the cluster's client URLs (`https://10.0.0.21:2379`; `host:port` is
    /// `http://` without TLS files and `https://` with them).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// etcd: the CA certificate that signed the etcd servers' certificates (PEM).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// etcd: this coordinator's client certificate (PEM), with `key`.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// etcd: the client certificate's private key (PEM), with `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// etcd: the prefix of every key; starts and ends with `/`. Default `/fleetmend/`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// etcd: how long one request may take. Default 5 s.
    #[serde(default, deserialize_with = "duration")]
    pub timeout: Option<Duration>,
}

/// Where and how to reach etcd, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Client URLs, each with its scheme (`http://` or `https://`).
    pub endpoints: Vec<String>,
    /// TLS: the CA certificate, if the endpoints are `https://`.
    pub ca: Option<PathBuf>,
    /// TLS: the client certificate and key, if etcd asks for one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The key prefix (starts and ends with `/`).
    pub prefix: String,
    /// The time limit of one request.
    pub timeout: Duration,
}

/// A wrong `[store]` key: the dotted key and what is wrong with it.
pub type Invalid = (&'static str, String);

impl StoreConfig {
    /// Checks every key that is set (whatever the backend), and what the chosen backend
    /// needs. `database` is the top-level SQLite file key.
    pub fn validate(&self, database: &std::path::Path) -> Result<(), Invalid> {
        let etcd = self.etcd_settings()?;
        match self.backend {
            Backend::Sqlite if database.as_os_str().is_empty() => Err((
                "database",
                "must name a file, e.g. /var/lib/fleetmend/coordinator/coordinator.db \
                 (or set [store] backend = \"etcd\")"
                    .into(),
            )),
            Backend::Sqlite => Ok(()),
            Backend::Etcd if etcd.endpoints.is_empty() => Err((
                "store.endpoints",
                "backend = \"etcd\" needs the cluster's client URLs, e.g. \
                 endpoints = [\"https://10.0.0.21:2379\", \"https://10.0.0.22:2379\", \
                 \"https://10.0.0.23:2379\"]"
                    .into(),
            )),
            Backend::Etcd => Ok(()),
        }
    }

    /// The etcd keys, checked and with their defaults (`endpoints` may be empty here:
    /// [`StoreConfig::validate`] requires it only for the etcd backend).
    pub fn etcd_settings(&self) -> Result<EtcdSettings, Invalid> {
        let tls = self.ca.is_some() || self.cert.is_some() || self.key.is_some();
        let mut endpoints = Vec::with_capacity(self.endpoints.len());
        for e in &self.endpoints {
            let e = endpoint(e, tls).map_err(|m| ("store.endpoints", m))?;
            // The store moves to the next endpoint when a member fails: the same member
            // twice would be no move at all.
            if endpoints.contains(&e) {
                return Err((
                    "store.endpoints",
                    format!("{e} is listed twice: name each etcd member once"),
                ));
            }
            endpoints.push(e);
        }
        for (key, path) in [
            ("store.ca", &self.ca),
            ("store.cert", &self.cert),
            ("store.key", &self.key),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err((key, "must name a file (or leave the key out)".into()));
            }
        }
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            (Some(_), None) => {
                return Err((
                    "store.key",
                    "`cert` is set: give its private key too".into(),
                ));
            }
            (None, Some(_)) => {
                return Err((
                    "store.cert",
                    "`key` is set: give its certificate too".into(),
                ));
            }
        };
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let http = endpoints.iter().find(|e| e.starts_with("http://"));
        if let (true, Some(plain)) = (tls, http) {
            return Err((
                "store.endpoints",
                format!(
                    "{plain} is plain http, but TLS files are set: write https:// (etcd's \
                     client URLs with TLS), or leave out ca, cert and key"
                ),
            ));
        }
        if https && self.ca.is_none() {
            return Err((
                "store.ca",
                "the endpoints are https://: give the CA certificate that signed the etcd \
                 servers' certificates"
                    .into(),
            ));
        }
        let prefix = self.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.into());
        if !prefix.starts_with('/') || !prefix.ends_with('/') || prefix.len() < 2 {
            return Err((
                "store.prefix",
                format!(
                    "{prefix:?} must start and end with `/` and name something, like \"/fleetmend/\" \
                     or \"/fleetmend/prod/\" (so that one fleet's prefix is never the start of \
                     another's)"
                ),
            ));
        }
        if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err((
                "store.prefix",
                format!("{prefix:?} holds a space or control character"),
            ));
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err((
                "store.timeout",
                "must be greater than 0, e.g. \"5s\"".into(),
            ));
        }
        Ok(EtcdSettings {
            endpoints,
            ca: self.ca.clone(),
            identity,
            prefix,
            timeout,
        })
    }
}

/// A duration as written in the file: a string with a unit (`"5s"`, `"500ms"`); a bare
/// number is refused, its unit would be a guess. (The same rule as the rest of the file;
/// kept here so that the store's section depends on nothing of the rest.)
fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Text(String),
        Number(f64),
    }
    let parsed = match Written::deserialize(d)? {
        Written::Number(n) => Err(format!(
            "{n} has no unit: durations are strings with a unit, like \"{n}s\" or \"{n}ms\""
        )),
        Written::Text(s) => s
            .trim()
            .parse::<jiff::SignedDuration>()
            .map_err(|_| format!("{s:?} is not a duration like \"5s\", \"500ms\" or \"1m 30s\""))
            .and_then(|d| Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))),
    };
    parsed.map(Some).map_err(serde::de::Error::custom)
}

/// One endpoint, with its scheme: `http(s)://host:port`, or `host:port` (https when TLS
/// files are set).
fn endpoint(e: &str, tls: bool) -> Result<String, String> {
    let e = e.trim();
    let (scheme, rest) = match e.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some((s, _)) => {
            return Err(format!(
                "{e:?}: scheme {s:?} is not etcd's; write http:// or https://"
            ));
        }
        None => (if tls { "https" } else { "http" }, e),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let bad = || {
        format!(
            "{e:?} is not a client URL like \"https://10.0.0.21:2379\" or \"etcd-1.example:2379\" \
             (host and port, nothing after)"
        )
    };
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let host_ok = !host.is_empty()
        && !host.contains('/')
        && !host.contains(char::is_whitespace)
        && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')));
    if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(format!("{scheme}://{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<StoreConfig, String> {
        toml::from_str::<StoreConfig>(text).map_err(|e| e.to_string())
    }

    fn settings(text: &str) -> Result<EtcdSettings, Invalid> {
        parse(text).unwrap().etcd_settings()
    }

    #[test]
    fn sqlite_is_the_default_and_needs_the_database_file() {
        let c = parse("").unwrap();
        assert_eq!(c.backend, Backend::Sqlite);
        c.validate(std::path::Path::new("/var/lib/c.db")).unwrap();
        let (key, why) = c.validate(std::path::Path::new("")).unwrap_err();
        assert_eq!(key, "database");
        assert!(why.contains("must name a file"), "{why}");
    }

    #[test]
    fn etcd_needs_endpoints_and_takes_the_defaults() {
        let c = parse("backend = \"etcd\"").unwrap();
        let (key, why) = c.validate(std::path::Path::new("")).unwrap_err();
        assert_eq!(key, "store.endpoints");
        assert!(why.contains("https://10.0.0.21:2379"), "{why}");
        let c =
            parse("backend = \"etcd\"\nendpoints = [\"127.0.0.1:2379\", \"http://[::1]:2379/\"]")
                .unwrap();
        c.validate(std::path::Path::new("")).unwrap();
        let s = c.etcd_settings().unwrap();
        assert_eq!(s.endpoints, ["http://127.0.0.1:2379", "http://[::1]:2379"]);
        assert_eq!(
            (s.prefix.as_str(), s.timeout),
            (DEFAULT_PREFIX, DEFAULT_TIMEOUT)
        );
        assert_eq!((s.ca, s.identity), (None, None));
        // One member twice, however it is written.
        let c = parse(
            "backend = \"etcd\"\nendpoints = [\"127.0.0.1:2379\", \"http://127.0.0.1:2379/\"]",
        )
        .unwrap();
        let (key, why) = c.validate(std::path::Path::new("")).unwrap_err();
        assert_eq!(key, "store.endpoints");
        assert!(
            why.contains("http://127.0.0.1:2379 is listed twice"),
            "{why}"
        );
    }

    #[test]
    fn tls_files_make_bare_endpoints_https_and_must_come_whole() {
        let s = settings(
            "endpoints = [\"etcd-1:2379\"]\nca = \"/e/ca.crt\"\ncert = \"/e/c.crt\"\nkey = \"/e/c.key\"\n\
             prefix = \"/fleetmend/prod/\"\ntimeout = \"2s\"",
        )
        .unwrap();
        assert_eq!(s.endpoints, ["https://etcd-1:2379"]);
        assert_eq!(s.identity, Some(("/e/c.crt".into(), "/e/c.key".into())));
        assert_eq!(
            (s.prefix.as_str(), s.timeout),
            ("/fleetmend/prod/", Duration::from_secs(2))
        );
        let e =
            settings("endpoints = [\"https://e:2379\"]\nca = \"/ca\"\ncert = \"/c\"").unwrap_err();
        assert_eq!(e.0, "store.key");
        let e = settings("endpoints = [\"https://e:2379\"]").unwrap_err();
        assert_eq!(e.0, "store.ca");
        let e = settings("endpoints = [\"http://e:2379\"]\nca = \"/ca\"").unwrap_err();
        assert!(
            e.0 == "store.endpoints" && e.1.contains("plain http"),
            "{e:?}"
        );
    }

    #[test]
    fn wrong_values_are_named_with_their_key() {
        for (text, key) in [
            ("endpoints = [\"e\"]", "store.endpoints"),
            ("endpoints = [\"e:0\"]", "store.endpoints"),
            ("endpoints = [\"e:2379/v3\"]", "store.endpoints"),
            ("endpoints = [\"unix://e:2379\"]", "store.endpoints"),
            ("prefix = \"fleetmend\"", "store.prefix"),
            ("prefix = \"/fleetmend\"", "store.prefix"),
            ("prefix = \"/\"", "store.prefix"),
            ("prefix = \"/a b/\"", "store.prefix"),
            ("timeout = \"0s\"", "store.timeout"),
            ("ca = \"\"", "store.ca"),
        ] {
            let e = settings(text).unwrap_err();
            assert_eq!(e.0, key, "{text}: {e:?}");
        }
        assert!(parse("timeout = 5").unwrap_err().contains("no unit"));
        assert!(
            parse("backend = \"postgres\"")
                .unwrap_err()
                .contains("sqlite")
        );
        assert!(
            parse("endpoint = []")
                .unwrap_err()
                .contains("unknown field")
        );
    }
}
