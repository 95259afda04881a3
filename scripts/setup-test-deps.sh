#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, and nothing by hand:
#   - apt: ipmitool (reference IPMI client), openipmi (ipmi_sim), python3-venv,
#     prometheus (for promtool), fence-agents (fence_ipmilan, fence_redfish, fence_apc_snmp
#     for the gateway's fence-agent backend), snmpd and snmp (net-snmp's agent playing a PDU,
#     and the snmpget/snmpset the SNMP fence agents run);
#   - the real Kubernetes control plane (kube-apiserver, kube-controller-manager, etcd),
#     built from their Go modules by scripts/build-k8s.sh and cached outside the work tree
#     (~/.cache/fleetmend, or $FLEETMEND_CACHE), for tests/tests/real_k8s*.rs (in the
#     background with FLEETMEND_K8S_BUILD=background, see below);
#   - a Python venv under build/venv with pyghmi (fake IPMI BMC) and sushy-tools
#     (sushy-emulator, Redfish) plus bcrypt/passlib for the emulator's htpasswd.
# Idempotent: when everything is already present it only checks and returns in a second.
# Runs as root in CI with no stdin; uses sudo only when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/build/venv"
# Pinned so every machine runs the same simulators (the tests depend on their behaviour,
# e.g. sushy's fake driver and its power-change delay).
PY_PKGS=(pyghmi==1.6.19 sushy-tools==2.2.0 bcrypt passlib)

say() { echo "setup-test-deps: $*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO="sudo -n"
fi

# protoc for the build (the etcd client's build script): its own script, also run by .ci/run
# before the build and by scripts/demo.sh.
scripts/setup-build-deps.sh

need_apt=()
command -v ipmitool >/dev/null 2>&1 || need_apt+=(ipmitool)
command -v ipmi_sim >/dev/null 2>&1 || need_apt+=(openipmi)
# promtool checks the alerting rules and live /metrics scrapes (tests/tests/prometheus.rs).
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The fence-agent backend and fencing levels (tests/tests/fence_levels.rs); Debian installs
# the agents and snmpd in /usr/sbin.
[ -x /usr/sbin/fence_ipmilan ] && [ -x /usr/sbin/fence_redfish ] && [ -x /usr/sbin/fence_apc_snmp ] \
  || need_apt+=(fence-agents)
[ -x /usr/sbin/snmpd ] || need_apt+=(snmpd)
command -v snmpset >/dev/null 2>&1 || need_apt+=(snmp)
# The venv is built with Debian's python3 so it does not depend on a user's pyenv.
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then
  need_apt+=(python3)
fi
if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  say "apt-get update"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  say "apt-get install ${need_apt[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}" </dev/null
else
  say "ipmitool, ipmi_sim, promtool, fence-agents, snmpd and python3-venv already installed"
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV"
  mkdir -p "$ROOT/build"
  "$PY" -m venv "$VENV"
fi
if "$VENV/bin/python" - "${PY_PKGS[@]}" >/dev/null 2>&1 <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and have != want:
        sys.exit(1)
PYEOF
then
  say "venv already has ${PY_PKGS[*]}"
else
  say "pip install ${PY_PKGS[*]} into $VENV"
  "$VENV/bin/pip" install --disable-pip-version-check -q "${PY_PKGS[@]}" </dev/null
fi
test -x "$VENV/bin/sushy-emulator" || { say "sushy-emulator missing from $VENV/bin after install"; exit 1; }
# The real control plane: a second run finds the cached binaries at once; a cold build
# takes long (docs/kubernetes.md gives the figures). With FLEETMEND_K8S_BUILD=background
# (scripts/test.sh and .ci/run set it) the build starts niced in the background and this
# script returns: the Rust build and the tests that need no control plane run meanwhile, and
# the tests that do need it wait for it (scripts/build-k8s.sh --wait).
if [ "${FLEETMEND_K8S_BUILD:-}" = background ]; then
  "$ROOT/scripts/build-k8s.sh" --background
else
  "$ROOT/scripts/build-k8s.sh" >/dev/null
fi
say "ok: ipmitool=$(command -v ipmitool) promtool=$(command -v promtool) ipmi_sim=$(command -v ipmi_sim) sushy-emulator=$VENV/bin/sushy-emulator"
