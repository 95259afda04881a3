//! `coordinatorctl`'s connection settings: flags, then `FLEETMEND_CTL_*` variables, then the
//! profile file (default `~/.config/fleetmend/coordinatorctl.toml`, like a kubeconfig), each
//! setting remembering where it came from so an error caused by a setting can say so.
//!
//! The profile is TOML with `server` (one `host:port`, or a list of them tried in order until
//! one answers: several coordinators), `server_name`, `ca`, `cert`, `key` and `timeout`;
//! relative paths are relative to the profile's directory, so `pki issue --role admin --out DIR` can print
//! a profile that works from anywhere. This module reads the profile and nothing else; it
//! opens no connection.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The profile's path under the user's configuration directory.
pub const PROFILE_SUBPATH: &str = "fleetmend/coordinatorctl.toml";

/// Where one setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag, e.g. `--cert`.
    Flag(&'static str),
    /// An environment variable, e.g. `FLEETMEND_CTL_CERT`.
    Env(&'static str),
    /// A key in the profile file.
    Profile {
        /// The key.
        key: &'static str,
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "flag {flag}"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::Profile { key, path } => write!(f, "`{key}` in profile {}", path.display()),
        }
    }
}

/// A setting's value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// Its origin.
    pub from: Origin,
}

/// The profile file's layout.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// Coordinator QUIC address, `host:port`, or several, tried in order.
    pub server: Option<Servers>,
    /// Name the coordinator's certificate must carry.
    pub server_name: Option<String>,
    /// Fleet CA certificate.
    pub ca: Option<PathBuf>,
    /// Admin certificate.
    pub cert: Option<PathBuf>,
    /// Admin key.
    pub key: Option<PathBuf>,
    /// Time limit for connecting and for each request, as `--timeout` (`30s`, `2m`).
    pub timeout: Option<String>,
}

/// `server` in a profile: one address or a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Servers {
    /// `server = "h:7443"`.
    One(String),
    /// `server = ["a:7443", "b:7443"]`: tried in order until one answers.
    Many(Vec<String>),
}

impl Servers {
    /// The addresses, in order.
    pub fn list(&self) -> Vec<String> {
        match self {
            Servers::One(s) => vec![s.clone()],
            Servers::Many(v) => v.clone(),
        }
    }
}

/// Where the profile is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfilePath {
    /// Named by `--profile` or `FLEETMEND_CTL_PROFILE`: it must exist.
    Explicit(PathBuf),
    /// The default location: read if present.
    Default(PathBuf),
    /// No home directory to look in.
    None,
}

impl ProfilePath {
    /// `explicit` if given, else `$XDG_CONFIG_HOME/fleetmend/coordinatorctl.toml`, else
    /// `$HOME/.config/fleetmend/coordinatorctl.toml`.
    pub fn choose(
        explicit: Option<&Path>,
        xdg_config_home: Option<&str>,
        home: Option<&str>,
    ) -> Self {
        if let Some(p) = explicit {
            return ProfilePath::Explicit(p.to_path_buf());
        }
        let base = match (xdg_config_home, home) {
            (Some(x), _) if !x.is_empty() => PathBuf::from(x),
            (_, Some(h)) if !h.is_empty() => Path::new(h).join(".config"),
            _ => return ProfilePath::None,
        };
        ProfilePath::Default(base.join(PROFILE_SUBPATH))
    }

    /// The path, if there is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ProfilePath::Explicit(p) | ProfilePath::Default(p) => Some(p),
            ProfilePath::None => None,
        }
    }
}

/// A profile as read: its settings with paths made absolute against its directory.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// The file read, if any.
    pub path: Option<PathBuf>,
    /// Its settings.
    pub file: ProfileFile,
}

impl Profile {
    /// Reads the profile. A missing default profile is an empty one; a missing explicit
    /// one, an unreadable or invalid one is an error naming the file.
    pub fn load(which: &ProfilePath) -> anyhow::Result<Self> {
        let (path, explicit) = match which {
            ProfilePath::Explicit(p) => (p, true),
            ProfilePath::Default(p) => (p, false),
            ProfilePath::None => return Ok(Self::default()),
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Self::default());
            }
            Err(e) => anyhow::bail!(
                "cannot read the profile {} (from --profile or FLEETMEND_CTL_PROFILE): {e}",
                path.display()
            ),
        };
        Self::parse(&text, path)
    }

    /// Parses profile text; relative paths are taken relative to `path`'s directory.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Self> {
        let mut file: ProfileFile = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!(
                "invalid profile {}: {}",
                path.display(),
                e.to_string().trim_end()
            )
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for p in [&mut file.ca, &mut file.cert, &mut file.key]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
        Ok(Self {
            path: Some(path.to_path_buf()),
            file,
        })
    }

    /// A profile setting with its origin.
    pub fn get<T: Clone>(
        &self,
        key: &'static str,
        pick: impl Fn(&ProfileFile) -> &Option<T>,
    ) -> Option<Sourced<T>> {
        let value = pick(&self.file).clone()?;
        Some(Sourced {
            value,
            from: Origin::Profile {
                key,
                path: self.path.clone().unwrap_or_default(),
            },
        })
    }
}

/// The text of a profile for the given files, as `pki issue --role admin` prints it.
pub fn profile_text(server: Option<&str>, ca: &Path, cert: &Path, key: &Path) -> String {
    let server = match server {
        Some(s) => format!("server = {s:?}\n"),
        None => "server = \"COORDINATOR-HOST:7443\"   # the coordinator's `listen` address\n"
            .to_string(),
    };
    format!(
        "{server}# server_name = \"…\"   # only if the coordinator's certificate does not carry the host of `server`\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
        ca.display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_follows_xdg_then_home() {
        assert_eq!(
            ProfilePath::choose(None, Some("/x"), Some("/home/a")),
            ProfilePath::Default(PathBuf::from("/x/fleetmend/coordinatorctl.toml"))
        );
        assert_eq!(
            ProfilePath::choose(None, Some(""), Some("/home/a")),
            ProfilePath::Default(PathBuf::from(
                "/home/a/.config/fleetmend/coordinatorctl.toml"
            ))
        );
        assert_eq!(
            ProfilePath::choose(Some(Path::new("p.toml")), Some("/x"), None),
            ProfilePath::Explicit(PathBuf::from("p.toml"))
        );
        assert_eq!(ProfilePath::choose(None, None, None), ProfilePath::None);
    }

    #[test]
    fn relative_paths_are_relative_to_the_profile() {
        let p = Profile::parse(
            "server = \"h:1\"\nca = \"ca.crt\"\ncert = \"/abs/me.crt\"\n",
            Path::new("/etc/prof/ctl.toml"),
        )
        .unwrap();
        assert_eq!(p.file.ca, Some(PathBuf::from("/etc/prof/ca.crt")));
        assert_eq!(p.file.cert, Some(PathBuf::from("/abs/me.crt")));
        let got = p.get("server", |f| &f.server).unwrap();
        assert_eq!(got.value, Servers::One("h:1".into()));
        assert_eq!(
            got.from.to_string(),
            "`server` in profile /etc/prof/ctl.toml"
        );
    }

    #[test]
    fn unknown_keys_and_missing_explicit_profiles_are_errors() {
        let e = Profile::parse("sever = \"x\"\n", Path::new("/p.toml")).unwrap_err();
        assert!(e.to_string().contains("sever"), "{e}");
        let missing = ProfilePath::Explicit(PathBuf::from("/nonexistent/p.toml"));
        assert!(Profile::load(&missing).is_err());
        let default = ProfilePath::Default(PathBuf::from("/nonexistent/p.toml"));
        assert!(Profile::load(&default).unwrap().path.is_none());
    }

    #[test]
    fn a_profile_names_several_coordinators_and_a_timeout() {
        let p = Profile::parse(
            "server = [\"a:7443\", \"b:7443\"]\ntimeout = \"5s\"\n",
            Path::new("/p.toml"),
        )
        .unwrap();
        assert_eq!(p.file.server.unwrap().list(), ["a:7443", "b:7443"]);
        assert_eq!(p.file.timeout.as_deref(), Some("5s"));
        let e = Profile::parse("server = 7443\n", Path::new("/p.toml")).unwrap_err();
        assert!(e.to_string().contains("invalid profile /p.toml"), "{e}");
    }

    #[test]
    fn printed_profile_parses_back() {
        let text = profile_text(
            Some("10.0.0.1:7443"),
            Path::new("/t/ca.crt"),
            Path::new("/t/me.crt"),
            Path::new("/t/me.key"),
        );
        let p = Profile::parse(&text, Path::new("/elsewhere/p.toml")).unwrap();
        assert_eq!(p.file.server, Some(Servers::One("10.0.0.1:7443".into())));
        assert_eq!(p.file.key, Some(PathBuf::from("/t/me.key")));
    }
}
