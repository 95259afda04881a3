#!/usr/bin/env bash
# The full-story demo: builds the binaries it needs, then starts on loopback the fake
# Kubernetes API server, a coordinator with automatic remediation and eight node-agents in
# two racks, and injects a hung kubelet, a dead machine and a rack power loss while printing
# what the coordinator decides by itself. Exit 0 when every failure ended as described.
# Pass --keep to leave the fleet running (until Ctrl-C) for the commands it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet -p fleetmend-coordinator -p fleetmend-node-agent -p fleetmend-tests --bins
FLEETMEND_BIN_DIR="$(pwd)/target/debug" exec target/debug/fleetmend-demo "$@"
