#!/usr/bin/env bash
# Runs the local demo fleet: builds the binaries, then starts a coordinator and four
# node-agents on loopback, breaks one server and repairs it. Pass --keep to leave it running.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet -p fleetmend-coordinator -p fleetmend-node-agent -p fleetmend-tests --bins
FLEETMEND_BIN_DIR="$(pwd)/target/debug" exec target/debug/fleetmend-demo "$@"
