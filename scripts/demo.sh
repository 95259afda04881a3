#!/usr/bin/env bash
# The full-story demo: builds the binaries it needs, then starts on loopback the fake
# Kubernetes API server, a coordinator with automatic remediation, a bmc-gateway in front of
# one OpenIPMI ipmi_sim BMC per machine, and eight node-agents in two racks, and injects a
# hung kubelet, a dead machine and a rack power loss while printing what the coordinator
# decides by itself. Exit 0 when every failure ended as described.
# Pass --keep to leave the fleet running (until Ctrl-C) for the commands it prints.
# Pass --etcd to keep the coordinator's state in an etcd (backend = "etcd") instead of SQLite.
# Pass --ha for two coordinators on an etcd: the leader is killed in the middle of the
# dead-machine story and the standby takes over (the timeline says who led when).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

have_ipmi_sim() {
  command -v ipmi_sim >/dev/null 2>&1 || [ -x /usr/sbin/ipmi_sim ] || [ -x /usr/bin/ipmi_sim ]
}

# ipmi_sim (Debian/Ubuntu package openipmi) plays the BMCs. Installed here when this user may
# (root, or sudo without a password prompt); otherwise the demo falls back to a stand-in
# script for the power cycle, and says so.
if ! have_ipmi_sim; then
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      sudo=(none)
    fi
  fi
  if [ "${sudo[0]:-}" != none ] && command -v apt-get >/dev/null 2>&1; then
    echo "demo.sh: installing openipmi (ipmi_sim plays the demo's BMCs) with apt-get"
    apt_install() {
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends openipmi >/dev/null
    }
    apt_install 2>/dev/null || { "${sudo[@]}" apt-get update -qq >/dev/null && apt_install; } ||
      echo "demo.sh: apt-get could not install openipmi"
  fi
  if ! have_ipmi_sim; then
    echo "demo.sh: ipmi_sim is NOT installed (as root: apt-get install openipmi), so this run has"
    echo "         no BMC and no bmc-gateway: a stand-in script power-cycles the dead machine."
  fi
fi

# protoc, for the etcd client's build script (installed with apt when this user may).
scripts/setup-build-deps.sh
# --etcd and --ha need etcd, built from its Go module (the first time: minutes; scripts/build-k8s.sh
# builds etcd first and marks it complete on its own, then goes on with Kubernetes).
for a in "$@"; do
  if { [ "$a" = --ha ] || [ "$a" = --etcd ]; } && ! scripts/build-k8s.sh --find >/dev/null 2>&1; then
    echo "demo.sh: $a: building etcd (and then the real control plane, in the background) with scripts/build-k8s.sh"
    scripts/build-k8s.sh --background >/dev/null
    FLEETMEND_K8S_WAIT=3600 scripts/build-k8s.sh --wait etcd >/dev/null
  fi
done
cargo build --quiet -p fleetmend-coordinator -p fleetmend-node-agent -p fleetmend-bmc-gateway \
  -p fleetmend-tests --bins
FLEETMEND_BIN_DIR="$(pwd)/target/debug" exec target/debug/fleetmend-demo "$@"
