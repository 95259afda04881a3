#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run against (tests/src/real_k8s.rs):
# kube-apiserver and kube-controller-manager from the k8s.io/kubernetes Go module, and etcd
# from go.etcd.io/etcd/server/v3, with the machine's Go toolchain. No prebuilt binary is
# fetched: only Go modules, through the go command.
#
# The binaries are cached outside the work tree, keyed by version:
#   ${FLEETMEND_CACHE:-$HOME/.cache/fleetmend}/k8s-v<K8S>-etcd-v<ETCD>/{kube-apiserver,kube-controller-manager,etcd}
# A second run finds them and returns at once. The Go module and build caches stay in their
# default places (go env GOMODCACHE GOCACHE), so a rebuild after a version change reuses them.
# etcd is built first (the store tests need only it) and marked complete on its own.
# Prints the cache directory on its last line of stdout.
#
#   scripts/build-k8s.sh               build unless cached, print the directory
#   scripts/build-k8s.sh --background  start that build niced in the background (its output in
#                                      <cache>/build-k8s.log) and return at once; nothing if
#                                      cached or already under way
#   scripts/build-k8s.sh --find        print the directory if built, else say so and exit 1
#   scripts/build-k8s.sh --wait [etcd] like --find, but first wait (up to
#                                      FLEETMEND_K8S_WAIT seconds, default 2400) for a build
#                                      under way to finish (with etcd: for its etcd only)
#
# One build at a time: a build holds <cache>/k8s-...lock (flock), and --wait waits on it. The
# test kit's lookup (tests/src/real_k8s) runs --wait, so scripts/test.sh can run the tests
# that need no control plane while the Go build uses the idle CPU.
set -euo pipefail

# Kubernetes 1.37 needs Go 1.26 (its go.mod says go 1.26.0): the machine's toolchain.
# Bump both together with a tested pair: kube-apiserver 1.37 is built against etcd's 3.6 client.
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16

say() { echo "build-k8s: $*" >&2; }
CACHE_ROOT=${FLEETMEND_CACHE:-$HOME/.cache/fleetmend}
OUT="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
BINS=(kube-apiserver kube-controller-manager etcd)

LOCK="$OUT.lock"
LOG="$CACHE_ROOT/build-k8s.log"

complete() {
  [ -f "$OUT/.complete" ] || return 1
  for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
etcd_complete() { { [ -f "$OUT/.etcd-complete" ] || [ -f "$OUT/.complete" ]; } && [ -x "$OUT/etcd" ]; }
# True while another process holds the build lock.
building() {
  [ -e "$LOCK" ] || return 1
  ! flock -n "$LOCK" true
}
mkdir -p "$CACHE_ROOT"
case "${1:-}" in
--find | --wait)
  want=complete
  [ "${2:-}" = etcd ] && want=etcd_complete
  if [ "$1" = --wait ] && ! $want && building; then
    limit=${FLEETMEND_K8S_WAIT:-2400}
    say "waiting for the build under way (its log: $LOG), up to $limit s"
    waited=0
    while ! $want && building && [ "$waited" -lt "$limit" ]; do
      sleep 2
      waited=$((waited + 2))
      [ $((waited % 120)) = 0 ] && say "still building after $waited s: $(tail -n 1 "$LOG" 2>/dev/null)"
    done
  fi
  if $want; then
    echo "$OUT"
    exit 0
  fi
  if [ "$want" = etcd_complete ]; then
    say "$OUT has no complete build of etcd"
  else
    say "$OUT has no complete build of kube-apiserver, kube-controller-manager and etcd"
  fi
  if [ -s "$LOG" ]; then
    say "the last build's log ($LOG) ends:"
    tail -n 5 "$LOG" >&2
  fi
  exit 1
  ;;
--background)
  if complete; then
    say "found $OUT (kube-apiserver, kube-controller-manager, etcd)"
    exit 0
  fi
  if building; then
    say "a build is already under way (its log: $LOG)"
    exit 0
  fi
  # The lock is taken here, before returning, so a --wait that starts right after sees the
  # build under way; the background build inherits it and holds it to the end.
  exec 9>"$LOCK"
  flock -n 9 || { say "a build is already under way (its log: $LOG)"; exit 0; }
  # Niced (and idle I/O class): on a 2-core machine the Rust build and the tests go first
  # and the Go build takes what they leave.
  FLEETMEND_K8S_LOCKED=1 nice -n 19 ionice -c 3 "$0" >"$LOG" 2>&1 </dev/null &
  say "building in the background, niced, pid $! (log: $LOG)"
  exit 0
  ;;
esac
# A --background start hands its lock down (fd 9); otherwise wait for any build under way.
if [ "${FLEETMEND_K8S_LOCKED:-}" != 1 ]; then
  exec 9>"$LOCK"
  flock 9
fi
if complete; then
  say "found $OUT (kube-apiserver, kube-controller-manager, etcd)"
  echo "$OUT"
  exit 0
fi
# A non-login shell (CI, cron) may lack the Go install's directory on PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH="$PATH:/usr/local/go/bin"
fi
command -v go >/dev/null 2>&1 || {
  say "the go command is missing: install Go 1.26 or newer (the Kubernetes $K8S_VERSION modules need it)"
  exit 1
}
say "building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION with $(go version) into $OUT (cold: about 15-30 min on 2 cores)"
mkdir -p "$OUT"
# Each module is built in its own throwaway main module, so their dependencies do not
# meet in one version selection (etcd's and Kubernetes' pins of grpc and otel differ).
work=$(mktemp -d "$CACHE_ROOT/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$SECONDS

# --- etcd ---------------------------------------------------------------------------------
mkdir -p "$work/etcd"
cd "$work/etcd"
printf 'module fleetmend.test/etcdbuild\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >go.mod
t=$SECONDS
say "go build go.etcd.io/etcd/server/v3"
go build -trimpath -ldflags "-s -w" -o "$work/etcd-bin" go.etcd.io/etcd/server/v3
say "etcd built in $((SECONDS - t)) s"
mv "$work/etcd-bin" "$OUT/etcd"
# Its first line only, read whole: `etcd --version | head -n 1` let head close the pipe before
# etcd had written its other lines, and under pipefail that SIGPIPE ended the build here
# (a race: it killed one cold build in two on the 2-core machine).
version=$("$OUT/etcd" --version)
say "${version%%$'\n'*}"
touch "$OUT/.etcd-complete"

# --- Kubernetes ---------------------------------------------------------------------------
mkdir -p "$work/k8s"
cd "$work/k8s"
gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$gomod" ] || { say "go mod download k8s.io/kubernetes@$K8S_VERSION gave no go.mod"; exit 1; }
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at
# v0.0.0 and replaces them with ./staging/src paths, which a dependent module cannot use:
# each is published as its own module at v0.<minor>.<patch>, and is pinned to that here.
staging_version="v0.${K8S_VERSION#v1.}"
{
  echo "module fleetmend.test/k8sbuild"
  echo
  echo "go 1.26.0"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
  echo ")"
} >go.mod
n=$(grep -c "=> k8s.io/.* $staging_version" go.mod || true)
[ "$n" -gt 10 ] || { say "found only $n staging modules in $gomod: its layout changed"; exit 1; }
vpkg=k8s.io/component-base/version
minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
for cmd in kube-apiserver kube-controller-manager; do
  t=$SECONDS
  say "go build k8s.io/kubernetes/cmd/$cmd"
  go build -trimpath -ldflags "$ldflags" -o "$work/$cmd" "k8s.io/kubernetes/cmd/$cmd"
  say "$cmd built in $((SECONDS - t)) s"
done

mv "$work/kube-apiserver" "$work/kube-controller-manager" "$OUT/"
"$OUT/kube-apiserver" --version >&2
touch "$OUT/.complete"
say "done in $((SECONDS - start)) s: $OUT"
echo "$OUT"
