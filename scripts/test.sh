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
  scripts/setup-test-deps.sh
fi

# Step timings go to stderr so a CI log shows where the time went.
step() {
  local name=$1 start=$SECONDS
  shift
  echo "test.sh: $name: $*" >&2
  "$@"
  echo "test.sh: $name took $((SECONDS - start)) s" >&2
}

profile=debug
build_args=()
for a in "$@"; do
  [ "$a" = -- ] && break
  if [ "$a" = --release ]; then
    profile=release
    build_args=(--release)
  fi
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
FLEETMEND_BIN_DIR="$bin_dir" step test cargo test --workspace "$@"
