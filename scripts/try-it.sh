#!/usr/bin/env bash
# Walks the README's "Running it for real" path on loopback, so the docs cannot drift from
# what works: a fleet PKI from `coordinatorctl pki`, an admin profile printed by
# `pki issue --role admin`, a coordinator with an inventory and a CKE repair YAML (checked
# first with `coordinator check`), two node-agents, one bmc-gateway in front of an ipmi_sim
# BMC, one `@power-cycle` repair, `machines list` and `repair-queue show`.
#
# Usage: scripts/try-it.sh [BIN_DIR]   (default target/debug; build with
#        `cargo build --workspace --bins` first). Needs ipmi_sim and ipmitool
#        (scripts/setup-test-deps.sh); without ipmi_sim it says so and exits 0 (skipped).
# Everything runs under a temporary directory, on 127.0.0.1, on ports nobody else uses;
# every process it starts is stopped on exit. Exit 0 when the walk worked.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -le 1 ] || { echo "usage: scripts/try-it.sh [BIN_DIR]" >&2; exit 2; }
bin=$(cd "${1:-$root/target/debug}" 2>/dev/null && pwd) ||
    { echo "try-it: ${1:-$root/target/debug} is not a directory; run cargo build --workspace --bins" >&2; exit 1; }
for b in coordinator coordinatorctl node-agent bmc-gateway; do
    [ -x "$bin/$b" ] || { echo "try-it: $bin/$b missing; run cargo build --workspace --bins" >&2; exit 1; }
done
if ! command -v ipmi_sim >/dev/null; then
    echo "try-it: ipmi_sim not installed (scripts/setup-test-deps.sh); skipped"
    exit 0
fi
export PATH="$bin:$PATH"
# A shell with other Fleetmend settings exported must not change this walk.
for v in $(env | sed -n 's/^\(FLEETMEND_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export NO_COLOR=1

lab=$(mktemp -d /tmp/fleetmend-try-it.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then echo "try-it: kept $lab"; else rm -rf "$lab"; fi
}
trap cleanup EXIT
fail() {
    echo "try-it: FAILED: $*" >&2
    for f in "$lab"/*.log "$lab"/ipmi/ipmi_sim.log; do
        [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
    done
    exit 1
}
step() { echo "== $*"; }
# A free UDP port on loopback: ask the kernel, then release it.
free_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
coord_port=$(free_port); gw_port=$(free_port); bmc_port=$(free_port)
http_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cd "$lab"

step "PKI: a CA, the coordinator, the gateway, two nodes and an admin"
coordinatorctl pki init --out ca --trust-domain lab.test >/dev/null
coordinatorctl pki issue --ca ca --role coordinator --name coordinator --ip 127.0.0.1 --out tls >/dev/null
coordinatorctl pki issue --ca ca --role gateway --name rack-1 --ip 127.0.0.1 --out tls >/dev/null
coordinatorctl pki issue --ca ca --role node --name lab-1 --out tls >/dev/null
coordinatorctl pki issue --ca ca --role node --name lab-2 --out tls >/dev/null
cp ca/ca.crt tls/ca.crt
# The admin's lines for the profile, as printed, with the server filled in.
coordinatorctl pki issue --ca ca --role admin --name me --out admin \
    | sed -n '/^server = /,$p' \
    | sed "s/^server = .*/server = \"127.0.0.1:$coord_port\"/" > profile.toml
grep -q '^cert = ' profile.toml || fail "pki issue --role admin printed no profile"

step "an IPMI BMC (ipmi_sim) for machine 10.0.1.11 on UDP $bmc_port"
mkdir -p ipmi/state
echo 1 > ipmi/power
cat > ipmi/chassis_control <<'EOF'
#!/bin/sh
cd "$(dirname "$0")"
shift
case "$1" in
get) shift
     for p in "$@"; do
       [ "$p" = power ] && echo "power:$(cat power)"
       [ "$p" = boot ] && echo "boot:default"
     done ;;
set) shift
     while [ $# -ge 2 ]; do
       echo "set $1 $2" >> events
       case "$1" in power) echo "$2" > power ;; shutdown) echo 0 > power ;; esac
       shift 2
     done ;;
esac
exit 0
EOF
chmod +x ipmi/chassis_control
cat > ipmi/lan.conf <<EOF
name "try-it"
set_working_mc 0x20
startlan 1
  addr 127.0.0.1 $bmc_port
  priv_limit admin
  allowed_auths_callback none md2 md5 straight
  allowed_auths_user none md2 md5 straight
  allowed_auths_operator none md2 md5 straight
  allowed_auths_admin none md2 md5 straight
  guid a123456789abcdefa123456789abcdef
endlan
chassis_control "$lab/ipmi/chassis_control 0x20"
user 2 true "admin" "bmc-secret-1" admin 10 none md2 md5 straight
EOF
cat > ipmi/emu.cmd <<'EOF'
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
mc_enable 0x20
EOF
(cd ipmi && exec ipmi_sim -c lan.conf -f emu.cmd -s state -n > ipmi_sim.log 2>&1) &
pids+=($!)

step "the gateway for rack-1 on UDP $gw_port"
echo bmc-secret-1 > ipmi.pw && chmod 600 ipmi.pw
cat > gateway.toml <<EOF
listen = "127.0.0.1:$gw_port"
state_dir = "$lab/gateway-state"

[tls]
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/rack-1.crt"
key = "$lab/tls/rack-1.key"

[[bmc]]
machine = "10.0.1.11"
protocol = "ipmi"
host = "127.0.0.1"
port = $bmc_port
username = "admin"
password_file = "$lab/ipmi.pw"
EOF
ok=
for _ in $(seq 1 50); do
    if bmc-gateway check --config gateway.toml > gateway-check.txt 2>&1; then ok=1; break; fi
    sleep 0.2
done
[ -n "$ok" ] || fail "bmc-gateway check: $(cat gateway-check.txt)"
bmc-gateway --config gateway.toml > gateway.log 2>&1 &
pids+=($!)
# `coordinator check` below asks the gateway which machines it serves: wait until it listens
# (it first probes its BMCs, which can take a second or two).
ok=
for _ in $(seq 1 100); do
    if grep -q "bmc-gateway listening" gateway.log 2>/dev/null; then ok=1; break; fi
    sleep 0.1
done
[ -n "$ok" ] || fail "the gateway did not start listening: $(cat gateway.log)"

step "the coordinator on UDP $coord_port with an inventory and a repair YAML"
cat > machines.toml <<'EOF'
[[machines]]
address = "10.0.1.11"
hostname = "lab-1"
serial = "SN-LAB-1"
rack = "rack-1"
machine_type = "lab"

# lab-2 only reports: the lab has one simulated BMC (lab-1's), and a machine of a type with
# power steps whose gateway has no [[bmc]] for it fails `coordinator check` (its first power
# step would fail at once), so its type has no procedure.
[[machines]]
address = "10.0.1.12"
hostname = "lab-2"
rack = "rack-1"
machine_type = "lab-no-bmc"
EOF
# The lab's machines are this host, which the simulated BMC cannot really power off, so
# `@agent-healthy` (it wants reports from a new boot after a power action) could never
# pass here: the health check is a stand-in that says the machine came back.
cat > cluster.yml <<'EOF'
repair:
  repair_procedures:
    - machine_types: [lab]
      repair_operations:
        - operation: power-cycle
          repair_steps:
            - repair_command: ["@power-cycle"]
              watch_seconds: 1
          health_check_command: ["sh", "-c", "echo true"]
EOF
cat > coordinator.toml <<EOF
listen = "127.0.0.1:$coord_port"
database = "$lab/coordinator.db"
inventory = "$lab/machines.toml"

[tls]
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/coordinator.crt"
key = "$lab/tls/coordinator.key"

[http]
listen = "127.0.0.1:$http_port"

[health]
report_interval = "1s"

[repair]
config = "$lab/cluster.yml"

[[gateways.targets]]
name = "rack-1"
address = "127.0.0.1:$gw_port"
server_name = "127.0.0.1"
racks = ["rack-1"]
EOF
coordinator check --config coordinator.toml || fail "coordinator check"
coordinator --config coordinator.toml > coordinator.log 2>&1 &
pids+=($!)

export FLEETMEND_CTL_PROFILE="$lab/profile.toml"
ok=
for _ in $(seq 1 100); do
    if coordinatorctl --timeout 2s machines list > /dev/null 2>&1; then ok=1; break; fi
    sleep 0.2
done
[ -n "$ok" ] || fail "the coordinator did not answer"

step "two node-agents (lab-1, lab-2) reading this host"
for n in lab-1 lab-2; do
    cat > "$n.toml" <<EOF
coordinator = "127.0.0.1:$coord_port"
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/$n.crt"
key = "$lab/tls/$n.key"
hostname = "$n"
report_interval = "1s"

[kubelet]
enabled = false

[kdump]
enabled = false
EOF
    node-agent run --config "$n.toml" > "$n.log" 2>&1 &
    pids+=($!)
done
ok=
for _ in $(seq 1 150); do
    list=$(coordinatorctl machines list --json)
    if [ "$(grep -c '"connected": true' <<<"$list")" = 2 ]; then ok=1; break; fi
    sleep 0.2
done
[ -n "$ok" ] || fail "both agents connected: $list"
coordinatorctl machines list

step "one @power-cycle repair of 10.0.1.11"
index=$(coordinatorctl repair-queue add power-cycle 10.0.1.11)
ok=
for _ in $(seq 1 300); do
    status=$(coordinatorctl repair-queue list --json | python3 -c 'import json,sys; print(next(e["status"] for e in json.load(sys.stdin) if e["index"]==sys.argv[1]))' "$index")
    case "$status" in succeeded|failed) ok=1; break ;; esac
    sleep 0.2
done
[ -n "$ok" ] || fail "repair $index did not finish (status $status)"
coordinatorctl repair-queue show "$index"
[ "$status" = succeeded ] || fail "repair $index ended $status"
# The BMC turns the power back on a moment after the cycle it accepted; the stand-in
# health check may pass before that.
for _ in $(seq 1 50); do grep -q '^set power 1' ipmi/events && break; sleep 0.2; done
grep -q '^set power 0' ipmi/events || fail "the BMC saw no power-off: $(cat ipmi/events)"
grep -q '^set power 1' ipmi/events || fail "the BMC did not power the machine back on: $(cat ipmi/events)"
echo "== the BMC saw: $(tr '\n' ';' < ipmi/events)"
echo "try-it: OK"
