#!/usr/bin/env bash
# Builds the three Debian packages with cargo-deb:
#   fleetmend-node-agent (from its own build with the `agent` profile of Cargo.toml),
#   fleetmend-coordinator (coordinator + coordinatorctl) and fleetmend-bmc-gateway (one
#   release build of the two).
# Each crate's [package.metadata.deb] says what goes in; systemd/ holds the units and
# packaging/<crate>/ the default config and maintainer scripts (docs/packaging.md).
# Installs cargo-deb from crates.io when missing (pinned, packaging/lib.sh). Output:
# target/debian/; check them with `packaging/check-debs.sh --release`.
# Usage: packaging/build-debs.sh [--no-build]   (--no-build: reuse target/<triple>/agent, target/release)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
. packaging/lib.sh

say() { echo "build-debs: $*"; }

build=1
# The agent is built for an explicit target (static linking needs one), so its binary and
# cargo-deb's view of it are under target/<triple>/agent/.
triple=$(rustc -vV | sed -n 's/^host: //p')
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    *) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
  esac
done

# cargo-deb compresses with the system's xz (packaging/lib.sh).
# protoc and its well-known types: the etcd client's build script compiles etcd's .proto
# files (scripts/setup-build-deps.sh).
ensure_apt xz:xz-utils
scripts/setup-build-deps.sh
ensure_cargo_deb

if [ "$build" = 1 ]; then
  # The agent on its own: built with the others, cargo would unify their dependencies'
  # features into it (a larger binary and more resident memory on every server).
  say "scripts/build-agent.sh agent (cargo build --profile agent --target $triple, crt-static)"
  scripts/build-agent.sh agent >/dev/null
  # The coordinator and the gateway with one feature resolution; cargo-deb then only strips
  # and packs (--no-build).
  say "cargo build --release -p fleetmend-coordinator -p fleetmend-bmc-gateway"
  cargo build --release --locked -p fleetmend-coordinator -p fleetmend-bmc-gateway --bins
fi

out=${CARGO_TARGET_DIR:-target}/debian
mkdir -p "$out"
# cargo-deb reads `target/release/` in the assets as "the chosen profile's directory".
say "cargo deb --profile agent --target $triple -p fleetmend-node-agent"
cargo deb --no-build --profile agent --target "$triple" -p fleetmend-node-agent --output "$out" >/dev/null
for pkg in fleetmend-coordinator fleetmend-bmc-gateway; do
  say "cargo deb -p $pkg"
  cargo deb --no-build -p "$pkg" --output "$out" >/dev/null
done
ls -1 "$out"/*.deb
