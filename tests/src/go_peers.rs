//! Where the test peers built from Go modules are: kube-apiserver, kube-controller-manager
//! and etcd, built and cached by `scripts/build-k8s.sh`. The lookups wait for a build under
//! way (scripts/test.sh starts one in the background on a fresh machine), so the tests that
//! need these peers can run while it finishes. Used by [`crate::real_k8s`] and [`crate::etcd`].

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::procs::workspace_root;

/// The directory holding `kube-apiserver`, `kube-controller-manager` and `etcd`:
/// `FLEETMEND_K8S_BIN_DIR`, or the cache `scripts/build-k8s.sh --wait` names. A build under way
/// (scripts/test.sh starts it in the background) is waited for; an error says what to run
/// when there is none.
pub fn binaries() -> anyhow::Result<PathBuf> {
    go_built(None)
}

/// The directory holding `etcd` alone, as [`binaries`] finds it but waiting only for the
/// build's etcd (built first), for the tests that need no control plane.
pub fn etcd_binary() -> anyhow::Result<PathBuf> {
    go_built(Some("etcd"))
}

fn go_built(only: Option<&str>) -> anyhow::Result<PathBuf> {
    let names: &[&str] = match only {
        Some(b) => &[b][..],
        None => &["kube-apiserver", "kube-controller-manager", "etcd"],
    };
    if let Some(d) = std::env::var_os("FLEETMEND_K8S_BIN_DIR") {
        let d = PathBuf::from(d);
        check_binaries(&d, names)?;
        return Ok(d);
    }
    let script = workspace_root().join("scripts/build-k8s.sh");
    let out = Command::new(&script)
        .arg("--wait")
        .args(only)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} not built: {}run scripts/setup-test-deps.sh (it builds kube-apiserver, \
             kube-controller-manager and etcd from their Go modules)",
            names.join(", "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    check_binaries(&d, names)?;
    Ok(d)
}

fn check_binaries(d: &Path, names: &[&str]) -> anyhow::Result<()> {
    for b in names {
        if !d.join(b).is_file() {
            bail!(
                "{} is missing: run scripts/setup-test-deps.sh (it builds kube-apiserver, \
                 kube-controller-manager and etcd from their Go modules)",
                d.join(b).display()
            );
        }
    }
    Ok(())
}
