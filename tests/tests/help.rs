//! Every binary's every (sub)command's `--help`, compared with the snapshots committed in
//! `tests/tests/snapshots/`, so that a changed flag, default, environment variable or
//! wording is seen in review instead of drifting from the docs.
//!
//! The commands are found by walking each help's `Commands:` list, so a new subcommand is
//! covered (and fails until its snapshot is committed). After an intended change, accept
//! the new text with `INSTA_UPDATE=always cargo test -p fleetmend-tests --test help` (or
//! `cargo insta review`) and commit the `.snap` files.

use testkit::procs::{command, run_ok};

/// The subcommands listed in a help text's `Commands:` section (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Snapshots `bin path… --help` and everything below it; returns how many were checked.
fn walk(bin: &str, path: &mut Vec<String>) -> anyhow::Result<usize> {
    let out = run_ok(command(bin).args(path.iter()).arg("--help"))?;
    let help = String::from_utf8(out.stdout)?;
    let name = std::iter::once(bin.to_string())
        .chain(path.iter().cloned())
        .collect::<Vec<_>>()
        .join("_");
    insta::assert_snapshot!(name, help);
    let mut n = 1;
    for sub in subcommands(&help) {
        path.push(sub);
        n += walk(bin, path)?;
        path.pop();
    }
    Ok(n)
}

#[test]
fn every_command_help_matches_its_snapshot() -> anyhow::Result<()> {
    let mut total = 0;
    for bin in ["coordinator", "coordinatorctl", "node-agent", "bmc-gateway"] {
        total += walk(bin, &mut Vec::new())?;
    }
    // Four binaries and their subcommands: a walk that found no subcommands is broken.
    assert!(total > 20, "only {total} help texts found");
    Ok(())
}

/// Every `coordinatorctl` command that takes a machine (`<MACHINE>` or `--machine`), found by
/// walking the help texts; returns each command's path and the arguments that give it an
/// empty machine name.
fn machine_args(path: &mut Vec<String>, found: &mut Vec<Vec<String>>) -> anyhow::Result<()> {
    let out = run_ok(command("coordinatorctl").args(path.iter()).arg("--help"))?;
    let help = String::from_utf8(out.stdout)?;
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap_or("");
    if usage.contains(" <MACHINE>") && !usage.contains("--machine <MACHINE>") {
        found.push(path.iter().cloned().chain([String::new()]).collect());
    }
    if help.contains("--machine <MACHINE>") {
        found.push(path.iter().cloned().chain(["--machine=".into()]).collect());
    }
    for sub in subcommands(&help) {
        path.push(sub);
        machine_args(path, found)?;
        path.pop();
    }
    Ok(())
}

#[test]
fn an_empty_machine_name_is_refused_before_connecting() -> anyhow::Result<()> {
    let mut found = Vec::new();
    machine_args(&mut Vec::new(), &mut found)?;
    // machines show/delete/set-state/clear/…, diagnostics, remediation, fence list.
    assert!(
        found.len() >= 8,
        "only {} commands take a machine: {found:?}",
        found.len()
    );
    for args in &found {
        let out = command("coordinatorctl")
            .args(["--server", "127.0.0.1:9"])
            .args(args)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("a value is required for") && err.contains("MACHINE"),
            "{args:?}: {err}"
        );
    }
    Ok(())
}

/// Numbers past what the program can count are refused or read as "no limit", never a panic.
#[test]
fn huge_numbers_are_refused_or_unbounded_not_a_panic() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = command("coordinatorctl")
        .args(["pki", "issue", "--ca"])
        .arg(dir.path())
        .args([
            "--role", "node", "--name", "n1", "--days", "99999999", "--out",
        ])
        .arg(dir.path())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--days") && err.contains("36500"), "{err}");
    // Fails to connect (nothing listens on port 9), after reading the limit as none.
    let out = command("coordinatorctl")
        .args(["--server", "127.0.0.1:9", "--timeout", "1s"])
        .args([
            "repair-queue",
            "wait",
            "--timeout-seconds",
            &u64::MAX.to_string(),
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    Ok(())
}

/// `coordinator check` fails where the start would: a logging variable the start refuses
/// (exit 64) is a failed line of its own.
#[test]
fn coordinator_check_refuses_what_the_start_would_in_the_logging_variables() -> anyhow::Result<()> {
    for (var, value) in [("FLEETMEND_LOG_FORMAT", "xml"), ("FLEETMEND_LOG", "=[")] {
        let out = command("coordinator")
            .args(["check", "--config", "/nonexistent/coordinator.toml"])
            .env(var, value)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(64), "{stdout}");
        let line = stdout
            .lines()
            .find(|l| l.starts_with("logging"))
            .unwrap_or_else(|| panic!("{var}={value}: no logging line in {stdout}"));
        assert!(line.contains("FAIL") && line.contains(var), "{line}");
    }
    Ok(())
}

#[test]
fn subcommands_are_read_from_the_commands_section() {
    let help = "Usage: x\n\nCommands:\n  pki       Fleet PKI\n  machines  Machines\n  help      Print this\n\nOptions:\n  -h\n";
    assert_eq!(subcommands(help), ["pki", "machines"]);
}
