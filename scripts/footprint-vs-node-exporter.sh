#!/usr/bin/env bash
# node-agent next to Debian's prometheus-node-exporter, on this machine, at the same time:
# resident memory, CPU per minute and per event, and binary size of both, with the ratios.
#
#   - node-agent (its own build, Cargo profile `agent`, as packaged) reporting every 1 s to
#     a real coordinator on loopback (mutual-TLS QUIC, certificates from `coordinatorctl
#     pki`), with kubelet (a stand-in answering /healthz), NIC (this host's interfaces that
#     are up), disk (/) and kdump checks on; an event is one report the coordinator received
#     (its fleetmend_reports_received_total);
#   - a second agent at the default 5 s interval, to its own coordinator;
#   - prometheus-node-exporter (default collectors) scraped every second with curl; an
#     event is one scrape.
# Each runs for a warm-up of 5 s, then --seconds (default 60) are measured. CPU is the sum
# of each thread's on-CPU nanoseconds (/proc/PID/task/*/schedstat, sampled every 0.25 s so
# threads that end are still counted) and is cross-checked with utime+stime (clock ticks,
# coarse); RSS is VmRSS at the end and VmHWM (peak).
#
# Installs prometheus-node-exporter with apt when missing (needs root for that; on a host
# with systemd the package also starts its own service, which this script leaves alone: it
# runs its own instance on a free port). Builds the agent as packaged
# (`scripts/build-agent.sh agent`) unless --agent-bin is given; takes coordinator and coordinatorctl
# from --bin-dir (default target/release if built there, else target/debug, else it builds
# them in debug: the coordinator's speed does not change the agent's figures). When --bin-dir
# also holds `cycle-floor` (`cargo build --release -p fleetmend-tests --bin cycle-floor`), it
# runs beside them and its figure is printed last: the kernel's cost of the same cycle.
#
# With --with-checks the agents also run three plugin checks (node-problem-detector style
# shell scripts, at NPD's default 30 s interval and 5 s timeout), the gpu check (`on`, reading
# a kernel log stand-in in the lab directory with a few Xid lines) and the memory check (`on`;
# a host without EDAC controllers makes it `unknown` each round).
#
# Usage: scripts/footprint-vs-node-exporter.sh [--seconds N] [--agent-bin PATH] [--bin-dir DIR] [--with-checks]
# Everything runs under a temporary directory on 127.0.0.1; every process it starts is
# stopped on exit.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60
agent_bin=
bin_dir=
with_checks=
while [ $# -gt 0 ]; do
    case "$1" in
        --with-checks) with_checks=1; shift ;;
        --seconds|--agent-bin|--bin-dir)
            [ $# -ge 2 ] || { echo "footprint: $1 needs a value" >&2; exit 2; }
            case "$1" in
                --seconds) seconds=$2 ;;
                --agent-bin) agent_bin=$2 ;;
                --bin-dir) bin_dir=$2 ;;
            esac
            shift 2 ;;
        *) echo "usage: $0 [--seconds N] [--agent-bin PATH] [--bin-dir DIR] [--with-checks]" >&2; exit 2 ;;
    esac
done
case "$seconds" in
    ''|*[!0-9]*|0) echo "footprint: --seconds must be a whole number above 0, got '$seconds'" >&2; exit 2 ;;
esac
say() { echo "footprint: $*" >&2; }
target_dir=${CARGO_TARGET_DIR:-$root/target}

exporter=/usr/bin/prometheus-node-exporter
if [ ! -x "$exporter" ]; then
    say "apt-get install prometheus-node-exporter"
    env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        prometheus-node-exporter </dev/null >&2
fi

if [ -z "$agent_bin" ]; then
    say "scripts/build-agent.sh agent (as packaged: own build, statically linked)"
    agent_bin=$("$root/scripts/build-agent.sh" agent "$target_dir")
fi
agent_bin=$(realpath "$agent_bin")
if [ -z "$bin_dir" ]; then
    if [ -x "$target_dir/release/coordinator" ] && [ -x "$target_dir/release/coordinatorctl" ]; then
        bin_dir=$target_dir/release
    else
        [ -x "$target_dir/debug/coordinator" ] && [ -x "$target_dir/debug/coordinatorctl" ] ||
            (cd "$root" && cargo build --quiet --locked -p fleetmend-coordinator --bins)
        bin_dir=$target_dir/debug
    fi
fi
bin_dir=$(realpath "$bin_dir")
for v in $(env | sed -n 's/^\(FLEETMEND_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export NO_COLOR=1

lab=$(mktemp -d /tmp/fleetmend-footprint.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then say "kept $lab"; else rm -rf "$lab"; fi
}
trap cleanup EXIT
fail() {
    echo "footprint: FAILED: $*" >&2
    for f in "$lab"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
    exit 1
}
port() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM if sys.argv[1]=="udp" else socket.SOCK_STREAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' "$1"; }
cd "$lab"
ctl=$bin_dir/coordinatorctl

"$ctl" pki init --out ca --trust-domain footprint.test >/dev/null
"$ctl" pki issue --ca ca --role coordinator --name coordinator --ip 127.0.0.1 --out tls >/dev/null
"$ctl" pki issue --ca ca --role admin --name me --out admin | sed -n '/^server = /,$p' >profile.toml
cp ca/ca.crt tls/ca.crt

# The kubelet's /healthz, as the agent's kubelet check expects it.
kubelet_port=$(port tcp)
python3 - "$kubelet_port" >kubelet.log 2>&1 <<'EOF' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
H.protocol_version = "HTTP/1.1"  # keep-alive, as the real kubelet (Go net/http) answers
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
pids+=($!)

# This host's interfaces that are up, as the NICs the agent requires.
nics=$(for n in /sys/class/net/*; do
    n=${n##*/}
    [ "$n" != lo ] && [ "$(cat "/sys/class/net/$n/operstate" 2>/dev/null)" = up ] && printf '"%s", ' "$n"
done || true)

# One coordinator and one agent per interval (the coordinator's report_interval is what it
# expects from its agents).
start_pair() {
    local name=$1 interval=$2 cport hport
    cport=$(port udp); hport=$(port tcp)
    "$ctl" pki issue --ca ca --role node --name "$name" --out tls >/dev/null
    cat >"machines-$name.toml" <<EOF
[[machines]]
address = "10.0.0.1"
hostname = "$name"
rack = "rack-1"
machine_type = "bench"
EOF
    cat >"coordinator-$name.toml" <<EOF
listen = "127.0.0.1:$cport"
database = "$lab/coordinator-$name.db"
inventory = "$lab/machines-$name.toml"

[tls]
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/coordinator.crt"
key = "$lab/tls/coordinator.key"

[http]
listen = "127.0.0.1:$hport"

[health]
report_interval = "$interval"
EOF
    "$bin_dir/coordinator" --config "coordinator-$name.toml" >"coordinator-$name.log" 2>&1 &
    pids+=($!)
    mkdir -p "state-$name"
    cat >"$name.toml" <<EOF
coordinator = "127.0.0.1:$cport"
ca = "$lab/tls/ca.crt"
cert = "$lab/tls/$name.crt"
key = "$lab/tls/$name.key"
hostname = "$name"
report_interval = "$interval"
nics = [${nics%, }]

[kubelet]
enabled = true
url = "http://127.0.0.1:$kubelet_port/healthz"

[kdump]
enabled = true

[[mounts]]
path = "/"

[actions]
state_dir = "$lab/state-$name"
EOF
    if [ -n "$with_checks" ]; then
        for i in 1 2 3; do
            cat >>"$name.toml" <<EOF

[[checks.exec]]
name = "plugin-$i"
path = "$lab/plugin.sh"
args = ["$i"]
EOF
        done
        cat >>"$name.toml" <<EOF

[checks.gpu]
enabled = "on"
kmsg = "$lab/kmsg"

[checks.memory]
enabled = "on"
EOF
    fi
    echo "$hport" >"$name.http"
}
if [ -n "$with_checks" ]; then
    cat >plugin.sh <<'EOF'
#!/bin/sh
# A node-problem-detector custom plugin: exit 0 OK, 1 problem, 2 unknown; first line of stdout.
if [ -r /proc/loadavg ]; then echo "plugin $1 ok"; exit 0; fi
echo "cannot read /proc/loadavg"; exit 2
EOF
    chmod 755 plugin.sh
    printf '%s\n' '6,1,1000,-;Linux version 6.1.0' \
        '4,2,61000000,-;NVRM: Xid (PCI:0000:86:00): 13, pid=4242, name=python3, Graphics SM Warp Exception' \
        '4,3,62000000,-;NVRM: Xid (PCI:0000:3b:00): 63, pid=1, Row remapping event' >kmsg
fi
start_pair agent-1s 1s
start_pair agent-5s 5s
sleep 0.5
for name in agent-1s agent-5s; do
    "$agent_bin" run --config "$name.toml" >"$name.log" 2>&1 &
    pids+=($!)
    echo $! >"$name.pid"
done

reports() { curl -sf "http://127.0.0.1:$(cat "$1.http")/metrics" | awk '/^fleetmend_reports_received_total/ {s += $NF} END {print s + 0}'; }
ok=
for _ in $(seq 1 150); do
    if [ "$(reports agent-1s 2>/dev/null || echo 0)" -ge 1 ] && [ "$(reports agent-5s 2>/dev/null || echo 0)" -ge 1 ]; then ok=1; break; fi
    sleep 0.2
done
[ -n "$ok" ] || fail "the agents' first reports did not arrive"

exporter_port=$(port tcp)
"$exporter" --web.listen-address="127.0.0.1:$exporter_port" >node-exporter.log 2>&1 &
exporter_pid=$!
pids+=($exporter_pid)
ok=
for _ in $(seq 1 50); do
    curl -sf -o /dev/null "http://127.0.0.1:$exporter_port/metrics" && { ok=1; break; }
    sleep 0.2
done
[ -n "$ok" ] || fail "node_exporter did not answer"
# Scraped every second, as Prometheus would with scrape_interval: 1s; one line per scrape.
(while :; do curl -sf -o /dev/null "http://127.0.0.1:$exporter_port/metrics" && echo; sleep 1; done >scrapes) &
pids+=($!)

# The kernel's share of a report cycle, for scale: cycle-floor (tests/src/bin/cycle-floor.rs)
# makes the same packets, file reads and waits as a 1 s agent with no QUIC, TLS or runtime.
floor_bin=$bin_dir/cycle-floor
if [ -x "$floor_bin" ]; then
    "$floor_bin" --interval 1s --cycles "$seconds" >floor.txt 2>&1 &
    floor_pid=$!
    pids+=($floor_pid)
fi

say "warm-up 5 s, then measuring for $seconds s"
sleep 5
# One line per process: PID, on-CPU ns, clock ticks, events, all over the same window.
python3 - "$seconds" \
    "$(cat agent-1s.pid)" "http://127.0.0.1:$(cat agent-1s.http)/metrics" \
    "$(cat agent-5s.pid)" "http://127.0.0.1:$(cat agent-5s.http)/metrics" \
    "$exporter_pid" scrapes >cpu.txt <<'EOF'
import os, sys, time, urllib.request
seconds, procs = float(sys.argv[1]), list(zip(sys.argv[2::2], sys.argv[3::2]))
def sched(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out[t] = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except (OSError, ValueError):
            pass
    return out
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
def events(src):
    if not src.startswith("http"):
        return sum(1 for _ in open(src))  # one line per scrape
    text = urllib.request.urlopen(src, timeout=5).read().decode()
    return sum(int(float(l.split()[-1])) for l in text.splitlines()
               if l.startswith("fleetmend_reports_received_total"))
first = {p: sched(p) for p, _ in procs}
seen = {p: dict(first[p]) for p, _ in procs}
t0 = {p: ticks(p) for p, _ in procs}
e0 = {p: events(src) for p, src in procs}
end = time.monotonic() + seconds
while time.monotonic() < end:
    time.sleep(0.25)
    for p, _ in procs:
        for t, ns in sched(p).items():
            seen[p][t] = max(seen[p].get(t, 0), ns)
for p, src in procs:
    ns = sum(v - first[p].get(t, 0) for t, v in seen[p].items())
    print(p, ns, ticks(p) - t0[p], events(src) - e0[p])
EOF

hz=$(getconf CLK_TCK)
kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
# row KEY NAME PID BINARY: the table row on stdout, KEY's raw figures on stderr.
row() {
    local key=$1 name=$2 pid=$3 bin=$4 ns tk events
    read -r _ ns tk events < <(grep "^$pid " cpu.txt)
    python3 - "$key" "$name" "$ns" "$tk" "$hz" "$events" "$seconds" \
        "$(kib "$pid" VmRSS)" "$(kib "$pid" VmHWM)" "$(stat -c %s "$bin")" <<'EOF'
import sys
key, name = sys.argv[1], sys.argv[2]
ns, tk, hz, ev, secs, rss, hwm, size = map(float, sys.argv[3:])
ms = ns / 1e6
print(f"{name:<27} {rss/1024:7.1f} {hwm/1024:8.1f} {ms*60/secs:10.1f} {tk*1000/hz*60/secs:10.0f}"
      f" {int(ev):6d} {ms/max(ev, 1):8.3f} {size/1e6:6.1f}")
print(key, rss, ms * 60 / secs, ms / max(ev, 1), size, file=sys.stderr)
EOF
}
echo
echo "node-agent:    $agent_bin ($("$agent_bin" --version 2>/dev/null | head -n1))"
echo "node_exporter: $exporter ($("$exporter" --version 2>&1 | head -n1))"
echo "measured over $seconds s on $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
printf '%-27s %7s %8s %10s %10s %6s %8s %6s\n' "" "RSS MiB" "peak MiB" "CPU ms/min" "(ticks)" events ms/event "bin MB"
{
    row agent-1s "node-agent (1 s reports)" "$(cat agent-1s.pid)" "$agent_bin"
    row agent-5s "node-agent (5 s reports)" "$(cat agent-5s.pid)" "$agent_bin"
    row exporter "node_exporter (1 s scrapes)" "$exporter_pid" "$exporter"
} 2>figures.txt
awk '
$1 == "agent-1s" { ar = $2; ac = $3; ae = $4; as = $5 }
$1 == "exporter" { nr = $2; nc = $3; ne = $4; ns = $5 }
END {
    printf "\nnode_exporter / node-agent (1 s): RSS %.1fx, CPU per minute %.1fx, CPU per event %.1fx, binary %.1fx\n",
        nr / ar, nc / ac, ne / ae, ns / as
}' figures.txt
if [ -n "${floor_pid:-}" ]; then
    wait "$floor_pid" || true
    echo "kernel floor of a 1 s cycle (same packets, reads and waits; no QUIC, TLS or runtime):"
    echo "  $(cat floor.txt)"
else
    echo "(no $floor_bin: build it with \`cargo build --release -p fleetmend-tests --bin cycle-floor\`"
    echo " into --bin-dir to print the kernel floor of a cycle beside the agent's figures)"
fi
