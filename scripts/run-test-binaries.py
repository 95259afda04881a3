#!/usr/bin/env python3
"""Runs the workspace's built test binaries several at a time, as `cargo test` would one by one.

Usage: run-test-binaries.py [--release] [--jobs N] [--late GLOB]... [--list] [-- ARGS...]

Most of the suite's wall time is spent waiting (processes starting, timers, QUIC keep-alives,
simulated BMCs), not computing, so on a 2-core machine `cargo test` running one test binary
after the other leaves the CPU mostly idle. This runner starts up to N binaries at once.

- The binaries come from `cargo test --workspace --no-run --message-format=json` (which builds
  nothing when `cargo build --workspace --bins --tests` ran before, as scripts/test.sh does);
  each runs in its package's directory, as under cargo test, with ARGS (test filters,
  `--nocapture`, ...).
- Longest first: the order is the durations the last run on this checkout recorded
  (target/test-durations.json), or, on a fresh checkout, SLOW_FIRST below. Binaries whose name
  matches a --late glob are started only after every other one has been started: they need the
  Go-built test peers (kube-apiserver, etcd), whose cold build runs niced in the background
  while the others run, and their test kit waits for it (scripts/build-k8s.sh --wait).
- Each binary's output goes to a log; a binary that fails has its whole log printed, one that
  passes only its result line, so the interleaving of concurrent binaries never mixes lines.
- At the end: the totals, the failing tests by binary, and the exit status (1 if any binary
  failed or could not start).
"""

import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

# The binaries that took longest in the last measured full runs (2026-11-28, 2-core machine),
# used for the order only when target/test-durations.json is missing (a fresh clone, CI).
SLOW_FIRST = [
    "power_repair",
    "fence_levels",
    "fencing",
    "demo",
    "coordinator (lib)",
    "bmc_gateway",
    "detectors",
    "ctl_json",
    "agent_actions",
    "kubernetes_faults",
]


def parse_args(argv):
    jobs = None
    late = []
    passthrough = []
    list_only = False
    release = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            passthrough = argv[i + 1 :]
            break
        if a in ("--jobs", "-j") and i + 1 < len(argv):
            jobs = int(argv[i + 1])
            i += 2
            continue
        if a.startswith("--jobs="):
            jobs = int(a.split("=", 1)[1])
        elif a == "--late" and i + 1 < len(argv):
            late.append(argv[i + 1])
            i += 2
            continue
        elif a == "--list":
            list_only = True
        elif a == "--release":
            release = True
        else:
            sys.exit(f"run-test-binaries.py: unknown argument {a!r} (test arguments go after --)")
        i += 1
    if jobs is None:
        jobs = int(os.environ.get("FLEETMEND_TEST_JOBS", "0") or 0) or (os.cpu_count() or 2) + 1
    if jobs < 1:
        sys.exit("run-test-binaries.py: --jobs must be at least 1")
    return jobs, late, passthrough, list_only, release


def test_binaries(release):
    """(name, kind, package dir, executable) of every test target, as cargo test would run."""
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run", "--message-format=json"]
        + (["--release"] if release else []),
        stdout=subprocess.PIPE,
        check=True,
    ).stdout
    found = []
    for line in out.splitlines():
        m = json.loads(line)
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        if not m["profile"]["test"]:
            continue
        t = m["target"]
        found.append(
            (t["name"], t["kind"][0], os.path.dirname(m["manifest_path"]), m["executable"])
        )
    return found


def label(b):
    name, kind = b[0], b[1]
    return name if kind == "test" else f"{name} ({kind})"


def main():
    jobs, late, passthrough, list_only, release = parse_args(sys.argv[1:])
    target_dir = os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.getcwd(), "target")
    durations_file = os.path.join(target_dir, "test-durations.json")
    try:
        with open(durations_file) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    binaries = test_binaries(release)

    def is_late(b):
        return any(fnmatch.fnmatch(b[0], g) for g in late)

    def weight(b):
        if label(b) in known:
            return known[label(b)]
        if label(b) in SLOW_FIRST:
            return 10_000 - SLOW_FIRST.index(label(b))
        return 0

    binaries.sort(key=lambda b: (is_late(b), -weight(b)))
    if list_only:
        for b in binaries:
            print(("late  " if is_late(b) else "early ") + label(b))
        return 0

    logs = tempfile.mkdtemp(prefix="fleetmend-tests-")
    lock = threading.Lock()
    results = {}
    queue = list(binaries)
    start_all = time.monotonic()
    print(
        f"run-test-binaries: {len(binaries)} test binaries, up to {jobs} at once; logs in {logs}",
        file=sys.stderr,
        flush=True,
    )

    def run(b):
        name, kind, pkg_dir, exe = b
        log = os.path.join(logs, f"{name}-{kind}.log")
        t0 = time.monotonic()
        with open(log, "wb") as f:
            try:
                rc = subprocess.run(
                    [exe] + passthrough, cwd=pkg_dir, stdout=f, stderr=subprocess.STDOUT
                ).returncode
            except OSError as e:
                f.write(f"cannot start {exe}: {e}\n".encode())
                rc = 127
        took = time.monotonic() - t0
        with open(log, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        summary = [l for l in text.splitlines() if l.startswith("test result:")]
        with lock:
            results[label(b)] = (rc, took, text)
            status = "ok" if rc == 0 else f"FAILED (exit {rc})"
            tail = summary[-1] if summary else "no result line"
            if rc == 0:
                print(f"{label(b)}: {status} in {took:.1f} s; {tail}", flush=True)
            else:
                print(f"\n===== {label(b)}: {status} in {took:.1f} s; output:", flush=True)
                print(text, flush=True)
                print(f"===== end of {label(b)}\n", flush=True)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            run(b)

    threads = [threading.Thread(target=worker) for _ in range(min(jobs, len(binaries)) or 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Totals, and the durations for the next run's order (only a full, unfiltered run's).
    totals = {"passed": 0, "failed": 0, "ignored": 0, "filtered out": 0}
    failing = []
    for lbl, (rc, took, text) in sorted(results.items()):
        for line in text.splitlines():
            if line.startswith("test result:"):
                for n, what in re.findall(r"(\d+) (passed|failed|ignored|filtered out)", line):
                    totals[what] += int(n)
            m = re.match(r"^test (\S+) \.\.\. FAILED$", line)
            if m:
                failing.append(f"{lbl}: {m.group(1)}")
        if rc != 0 and not any(f.startswith(lbl + ":") for f in failing):
            failing.append(f"{lbl}: the binary failed (exit {rc}) without a failing test line")
    if not passthrough:
        known.update({lbl: round(took, 1) for lbl, (rc, took, _) in results.items()})
        try:
            with open(durations_file, "w") as f:
                json.dump(known, f, indent=1, sort_keys=True)
        except OSError:
            pass
    wall = time.monotonic() - start_all
    slowest = sorted(results.items(), key=lambda kv: -kv[1][1])[:5]
    print(
        f"\nrun-test-binaries: {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['ignored']} ignored, {totals['filtered out']} filtered out, "
        f"in {wall:.0f} s ({jobs} at once); slowest: "
        + ", ".join(f"{lbl} {took:.0f} s" for lbl, (_, took, _) in slowest),
        flush=True,
    )
    if failing:
        print("failures:\n  " + "\n  ".join(failing), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
