#!/usr/bin/env bash
# The fleet simulator / scale benchmark: builds the release coordinator, coordinatorctl and
# fleet-sim, then runs N simulated agents (real QUIC, one certificate each) against a real
# coordinator and prints connect time, reports/s, ack latency, coordinator CPU per report,
# RSS per agent and the time to detect 1 % of the agents killed at once.
#   scripts/fleet-sim.sh --agents 1000 --interval 1s --duration 60s
#   scripts/fleet-sim.sh --agents 10000 --interval 5s --duration 60s [--json]
# Set CARGO_TARGET_DIR to build elsewhere; FLEET_SIM_PROFILE=debug for a quick try.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
profile="${FLEET_SIM_PROFILE:-release}"
flag=(); [ "$profile" = release ] && flag=(--release)
cargo build --quiet "${flag[@]}" -p fleetmend-coordinator --bins -p fleetmend-tests --bin fleet-sim
target="${CARGO_TARGET_DIR:-$(pwd)/target}/$profile"
# Each simulated agent holds a connection in this process and one in the coordinator.
[ "$(ulimit -n)" -ge 4096 ] || ulimit -n 65536 2>/dev/null || true
FLEETMEND_BIN_DIR="$target" exec "$target/fleet-sim" "$@"
