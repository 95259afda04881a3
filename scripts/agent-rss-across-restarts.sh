#!/usr/bin/env bash
# Measures node-agent's resident memory across coordinator restarts: starts a coordinator
# and one agent on loopback (1 s reports), then stops the coordinator RESTARTS times, in
# turn with SIGTERM and SIGKILL, starting it again each time, and prints the agent's VmRSS
# (KiB) at the start and after each reconnect. A figure that jumps and stays after a
# restart is memory the agent keeps for good; docs/benchmarks.md has the figures.
#
# Usage: scripts/agent-rss-across-restarts.sh [--bin-dir DIR] [--agent-bin FILE] [--restarts N]
#   --bin-dir    where coordinator and coordinatorctl are (default target/release)
#   --agent-bin  the agent to measure (default: the packaged build,
#                `scripts/build-agent.sh agent target` prints its path)
#   --restarts   coordinator restarts (default 6)
# Everything runs under a temporary directory and is stopped on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir="$root/target/release"
agent=""
restarts=6
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0" | sed '$d'; exit 0 ;;
        --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
        --agent-bin) agent=${2:?--agent-bin needs a file}; shift 2 ;;
        --restarts) restarts=${2:?--restarts needs a number}; shift 2 ;;
        *) echo "agent-rss-across-restarts: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$restarts" in ''|*[!0-9]*|0) echo "agent-rss-across-restarts: --restarts must be a number above 0, not $restarts" >&2; exit 2 ;; esac
[ -n "$agent" ] || agent="$root/target/x86_64-unknown-linux-gnu/agent/node-agent"
for b in "$bin_dir/coordinator" "$bin_dir/coordinatorctl" "$agent"; do
    [ -x "$b" ] || { echo "agent-rss-across-restarts: $b missing (build it first; see --help)" >&2; exit 1; }
done
bin_dir=$(cd "$bin_dir" && pwd)
agent=$(cd "$(dirname "$agent")" && pwd)/$(basename "$agent")
for v in $(env | sed -n 's/^\(FLEETMEND_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

lab=$(mktemp -d /tmp/fleetmend-rss.XXXXXX)
coord_pid=""; agent_pid=""
cleanup() {
    for p in $agent_pid $coord_pid; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$lab"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
quic=$(port); http=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cd "$lab"
"$bin_dir/coordinatorctl" pki init --out ca --trust-domain rss.test >/dev/null
"$bin_dir/coordinatorctl" pki issue --ca ca --role coordinator --name coordinator --ip 127.0.0.1 --out tls >/dev/null
"$bin_dir/coordinatorctl" pki issue --ca ca --role node --name rss-1 --out tls >/dev/null
cp ca/ca.crt tls/
cat > coordinator.toml <<EOF
listen = "127.0.0.1:$quic"
database = "$lab/c.db"
[tls]
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/coordinator.crt"
key = "$lab/tls/coordinator.key"
[http]
listen = "127.0.0.1:$http"
[health]
report_interval = "1s"
EOF
cat > agent.toml <<EOF
coordinator = "127.0.0.1:$quic"
server_name = "127.0.0.1"
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/rss-1.crt"
key = "$lab/tls/rss-1.key"
report_interval = "1s"
hostname = "rss-1"
[kubelet]
enabled = false
EOF
start_coordinator() { "$bin_dir/coordinator" --config coordinator.toml >> coordinator.log 2>&1 & coord_pid=$!; }
# Waits until the agent has connected N times, then 3 s more (a few reports).
accepted() { grep -c "connected coordinator" agent.log || true; }
wait_connected() {
    local want=$1
    for _ in $(seq 1 100); do
        [ "$(accepted)" -ge "$want" ] && { sleep 3; return 0; }
        sleep 0.1
    done
    echo "agent-rss-across-restarts: the agent did not reconnect; its log:" >&2
    tail -n 20 agent.log >&2
    exit 1
}
rss() { awk '/^VmRSS/ {print $2}' "/proc/$agent_pid/status"; }

start_coordinator
"$agent" run --config agent.toml > agent.log 2>&1 & agent_pid=$!
wait_connected 1
printf 'agent %s\n' "$agent"
printf '%-24s %s\n' "start" "$(rss) KiB"
for i in $(seq 1 "$restarts"); do
    if [ $((i % 2)) = 1 ]; then sig=TERM; else sig=KILL; fi
    kill -s "$sig" "$coord_pid"; wait "$coord_pid" 2>/dev/null || true
    start_coordinator
    wait_connected $((i + 1))
    printf '%-24s %s\n' "after restart $i (SIG$sig)" "$(rss) KiB"
done
