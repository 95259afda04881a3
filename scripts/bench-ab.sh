#!/usr/bin/env bash
# A/B benchmark: builds BASE (a git revision) and the current checkout in release with one
# shared target directory (crates.io dependencies compile once), then runs the coordinator
# load and repair queue benchmarks alternately, base then current, ROUNDS times each, so
# both see the same machine. Usage: scripts/bench-ab.sh BASE [ROUNDS]
#
# NO_SETPRIV=1 hides util-linux setpriv from the coordinators (a private mount namespace
# binds /dev/null over it; needs root), which shows what the parent-death-signal helper
# costs per command.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
base=${1:?usage: scripts/bench-ab.sh BASE [ROUNDS]}
rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
git -C "$root" rev-parse --verify --quiet "$base^{commit}" >/dev/null ||
  { echo "bench-ab: $base is not a git revision here (usage: scripts/bench-ab.sh BASE [ROUNDS])" >&2; exit 2; }
case "$rounds" in ''|*[!0-9]*|0) echo "bench-ab: ROUNDS must be a whole number above 0, got $rounds" >&2; exit 2 ;; esac
work=${BENCH_AB_DIR:-$root/target/bench-ab}
export CARGO_TARGET_DIR=$work/target
mkdir -p "$work"
if [ ! -d "$work/base-src" ]; then
  git -C "$root" worktree add --detach "$work/base-src" "$base" >/dev/null
fi
git -C "$work/base-src" checkout --quiet --detach "$base"

build() { # build SIDE SRC
  local side=$1 src=$2 t
  echo "bench-ab: building $side ($src)" >&2
  (cd "$src" && cargo build --release --workspace --bins --test foundation --test repair_queue)
  mkdir -p "$work/$side"
  cp "$CARGO_TARGET_DIR"/release/{coordinator,coordinatorctl,node-agent,bmc-gateway} "$work/$side/"
  for t in foundation repair_queue; do
    cp "$(ls -t "$CARGO_TARGET_DIR"/release/deps/"$t"-* | grep -v '\.d$' | head -1)" "$work/$side/$t"
  done
}
build base "$work/base-src"
build current "$root"

run() { # run SIDE TEST NAME
  local side=$1 test=$2 name=$3
  local cmd="FLEETMEND_BIN_DIR=$work/$side $work/$side/$test --ignored --nocapture --exact $name"
  if [ "${NO_SETPRIV:-0}" = 1 ]; then
    cmd="mount --bind /dev/null /usr/bin/setpriv && $cmd"
    unshare -m sh -c "$cmd"
  else
    sh -c "$cmd"
  fi
}
for r in $(seq "$rounds"); do
  for side in base current; do
    echo "=== round $r $side coordinator_load"
    run "$side" foundation coordinator_load 2>&1 | grep -E "CPU|RSS|latency"
    echo "=== round $r $side bench_10000_entries"
    run "$side" repair_queue bench_10000_entries 2>&1 | grep -E "enqueue|completion"
  done
done
