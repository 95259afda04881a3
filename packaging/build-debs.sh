#!/usr/bin/env bash
# Builds the three Debian packages with cargo-deb, from one release build:
#   fleetmend-node-agent, fleetmend-coordinator (coordinator + coordinatorctl),
#   fleetmend-bmc-gateway.
# Each crate's [package.metadata.deb] says what goes in; systemd/ holds the units and
# packaging/<crate>/ the default config and maintainer scripts (docs/packaging.md).
# Installs cargo-deb from crates.io when missing (pinned, --locked). Output: target/debian/.
# Usage: packaging/build-debs.sh [--no-build]   (--no-build: reuse target/release)
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so every machine builds the same package layout; 3.x is the first line that
# needs a Rust as new as the workspace's anyway.
CARGO_DEB_VERSION=3.6.2

say() { echo "build-debs: $*"; }

build=1
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    *) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
  esac
done

have=$(cargo deb --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$CARGO_DEB_VERSION" ]; then
  say "installing cargo-deb $CARGO_DEB_VERSION (found: ${have:-none})"
  # Its xz support builds a bundled liblzma with the C compiler; nothing else is needed.
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --quiet
fi

if [ "$build" = 1 ]; then
  # One build of the three packages' binaries with one feature resolution; cargo-deb then
  # only strips and packs (--no-build).
  say "cargo build --release"
  cargo build --release --locked \
    -p fleetmend-node-agent -p fleetmend-coordinator -p fleetmend-bmc-gateway --bins
fi

out=target/debian
mkdir -p "$out"
for pkg in fleetmend-node-agent fleetmend-coordinator fleetmend-bmc-gateway; do
  say "cargo deb -p $pkg"
  cargo deb --no-build -p "$pkg" --output "$out" >/dev/null
done
ls -1 "$out"/*.deb
