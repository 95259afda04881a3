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
    // Rebuild when HEAD moves: HEAD itself (a checkout), its reflog (every commit, also
    // when the branch ref is packed) and the branch's ref file. Only files that exist are
    // named: cargo reruns a build script on every build for a missing one.
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    watch.push(git(&["rev-parse", "--git-path", "logs/HEAD"]));
    if let Some(name) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &name]));
    }
    for path in watch.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=FLEETMEND_GIT_COMMIT={commit}");
}
