#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs the test peers, builds everything
# once, then runs the test binaries several at a time (scripts/run-test-binaries.py) and the
# doc tests. Arguments: `--release`, `--no-fail-fast` (the runner never stops early), a test
# name filter, and after `--` the test binaries' own (`-- --nocapture`); any other cargo
# option (`--test FILE`, `-p CRATE`, ...) runs one plain `cargo test --workspace` with them.
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
# Any other cargo option before `--` gets one plain cargo test run too (the runner below
# knows only --release and --no-fail-fast, and a test name filter).
own_targets=0
filter=()
for a in "$@"; do
  [ "$a" = -- ] && break
  case "$a" in
  --release)
    profile=release
    build_args=(--release)
    ;;
  --no-fail-fast) ;;
  -*)
    own_targets=1
    ;;
  *) filter+=("$a") ;;
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
# The test binaries run several at a time (scripts/run-test-binaries.py: most of the suite's
# time is spent waiting on processes and timers, not computing), longest first. Those that
# need the Go-built peers (their names match `late` below) are started last: a cold Go build
# of the peers (started niced in the background by setup-test-deps.sh) takes the CPU the
# others leave idle, and their test kit waits for a build under way (scripts/build-k8s.sh
# --wait). Then the doc tests. Both runs always happen; the script fails if either did.
# Arguments that pick test targets (`--test FILE`, `-p CRATE`, ...) get one plain cargo test.
if [ "$own_targets" = 1 ]; then
  FLEETMEND_BIN_DIR="$bin_dir" step test cargo test --workspace "$@"
  exit
fi
# Before `--`: cargo's options for the runner (--release, --no-fail-fast: it never stops
# early); after: the test binaries' own arguments (a name filter, --nocapture, ...).
runner_args=()
[ "$profile" = release ] && runner_args+=(--release)
test_args=("${filter[@]}")
seen_dashes=0
for a in "$@"; do
  if [ "$seen_dashes" = 1 ]; then
    test_args+=("$a")
  elif [ "$a" = -- ]; then
    seen_dashes=1
  fi
done
failed=0
FLEETMEND_BIN_DIR="$bin_dir" step test python3 scripts/run-test-binaries.py "${runner_args[@]}" \
  --late 'real_k8s*' --late 'etcd*' --late 'store_conformance*' -- "${test_args[@]}" || failed=1
doc_args=()
[ "$profile" = release ] && doc_args+=(--release)
FLEETMEND_BIN_DIR="$bin_dir" step doc-tests cargo test --workspace --doc "${doc_args[@]}" -- "${test_args[@]}" || failed=1
exit "$failed"
