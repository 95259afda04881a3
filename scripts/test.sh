#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs the test peers, builds everything
# once, then cargo test. Extra arguments go to `cargo test` (e.g. `-- --nocapture`).
#
# Build once: `cargo build --workspace --bins --tests` compiles every test target and every
# binary with the feature resolution `cargo test --workspace` uses (dev-dependencies
# included), so the test step compiles nothing. The end-to-end tests run the binaries from
# FLEETMEND_BIN_DIR and never start cargo themselves (tests/src/procs.rs; without the
# variable, as in a developer's plain `cargo test`, they run that same build lazily).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/setup-test-deps.sh ]; then
  FLEETMEND_K8S_BUILD=background scripts/setup-test-deps.sh
fi

# Step timings go to stderr so a CI log shows where the time went.
step() {
  local name=$1 start=$SECONDS
  shift
  echo "test.sh: $name: $*" >&2
  local rc=0
  "$@" || rc=$?
  echo "test.sh: $name took $((SECONDS - start)) s" >&2
  return "$rc"
}

profile=debug
build_args=()
# Arguments that choose test targets themselves: then one plain cargo test run.
own_targets=0
for a in "$@"; do
  [ "$a" = -- ] && break
  case "$a" in
  --release)
    profile=release
    build_args=(--release)
    ;;
  --test | --test=* | --lib | --bins | --bin | --bin=* | --doc | --tests | -p | --package | --package=*)
    own_targets=1
    ;;
  esac
done
step build cargo build --workspace --bins --tests "${build_args[@]}"
# node-agent as it ships (scripts/build-agent.sh: on its own, without the features the other
# crates unify into it in a workspace build, and statically linked). Its explicit --target
# puts it in target/<host triple>/, so it never overwrites the workspace's agent, while it
# shares target/debug's build scripts and proc-macros. The tests get a directory of binaries
# (target/<profile>-bin): the workspace's by symlink, the agent's own build by hard link.
target_dir=${CARGO_TARGET_DIR:-$(pwd)/target}
agent_profile=dev
[ "$profile" = release ] && agent_profile=release
agent_bin=$(step agent scripts/build-agent.sh "$agent_profile" "$target_dir")
bin_dir="$target_dir/$profile-bin"
rm -rf "$bin_dir" && mkdir -p "$bin_dir"
find "$target_dir/$profile" -maxdepth 1 -type f -perm -u+x -exec ln -s {} "$bin_dir/" \;
ln -f "$agent_bin" "$bin_dir/node-agent"
# Three runs of cargo test. The first runs every test that needs none of the Go-built peers
# while a cold Go build of them (started niced in the background by setup-test-deps.sh)
# takes the CPU those tests leave idle; the second runs the doc tests; the third, the
# integration tests that need those peers (their names match `late` below), for which the
# test kit waits for a build under way (scripts/build-k8s.sh --wait). All runs always
# happen; the script fails if any did.
if [ "$own_targets" = 1 ]; then
  FLEETMEND_BIN_DIR="$bin_dir" step test cargo test --workspace "$@"
  exit
fi
late=('real_k8s*' 'etcd*' 'store_conformance*')
mapfile -t targets < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import fnmatch, json, sys
late = sys.argv[1:]
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"]:
            print(("late " if any(fnmatch.fnmatch(t["name"], g) for g in late) else "early ") + t["name"])
' "${late[@]}")
early_args=(--lib --bins)
late_args=()
for t in "${targets[@]}"; do
  case "$t" in
  early\ *) early_args+=(--test "${t#early }") ;;
  late\ *) late_args+=(--test "${t#late }") ;;
  esac
done
failed=0
FLEETMEND_BIN_DIR="$bin_dir" step test cargo test --workspace "${early_args[@]}" "$@" || failed=1
FLEETMEND_BIN_DIR="$bin_dir" step doc-tests cargo test --workspace --doc "$@" || failed=1
if [ ${#late_args[@]} -gt 0 ]; then
  FLEETMEND_BIN_DIR="$bin_dir" step test-go-peers cargo test --workspace "${late_args[@]}" "$@" || failed=1
fi
exit "$failed"
