//! Records the git commit the binaries are built from, for `--version`.
//!
//! `FLEETMEND_GIT_COMMIT` at build time wins (packaging from a tarball, or a developer who
//! does not want every commit to rebuild the workspace); otherwise `git rev-parse`; outside
//! a git checkout, "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FLEETMEND_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(c) = std::env::var("FLEETMEND_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        println!("cargo:rustc-env=FLEETMEND_GIT_COMMIT={c}");
        return;
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Rebuild when HEAD moves: HEAD itself (a checkout) and the branch it points at (a commit).
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={head}");
    }
    if let Some(name) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(reference) = git(&["rev-parse", "--git-path", &name])
    {
        println!("cargo:rerun-if-changed={reference}");
    }
    println!("cargo:rustc-env=FLEETMEND_GIT_COMMIT={commit}");
}
