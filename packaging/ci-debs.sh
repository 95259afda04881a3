#!/usr/bin/env bash
# CI: packs the three Debian packages from the debug binaries the test step already built
# (scripts/test.sh) and checks them with packaging/check-debs.sh: dpkg-deb --info/--contents,
# lintian without errors, `systemd-analyze verify` on each unit, install + reinstall + purge
# in a throwaway root leaving nothing behind.
#
# Nothing is compiled here apart from a missing cargo-deb: the packages are the release
# packages' layout (same metadata, units, configs, maintainer scripts) around the debug
# binaries, so what they check is the packaging, not the release build
# (packaging/build-debs.sh makes those, and `check-debs.sh --release` checks them).
# The agent packaged is the agent's own build (not the workspace's, whose feature
# unification pulls more into the agent), which scripts/test.sh made (scripts/build-agent.sh, in target/<triple>/debug/):
# it is copied to target/debug/node-agent, where cargo-deb looks for it.
#
# Installs cargo-deb (pinned, packaging/lib.sh) and lintian when missing. Runs as root.
# Usage: packaging/ci-debs.sh [--tools-only]   Output: target/debian-ci/
# --tools-only: install the tools and stop (.ci/run does that while the build runs).
set -euo pipefail
cd "$(dirname "$0")/.."
. packaging/lib.sh

say() { echo "ci-debs: $*"; }
start=$SECONDS
# xz-utils comes with lintian: cargo-deb (built without liblzma) compresses with `xz`.
ensure_apt lintian:lintian xz:xz-utils systemd-analyze:systemd
ensure_cargo_deb
if [ "${1:-}" = --tools-only ]; then
  say "tools ready in $((SECONDS - start)) s"
  exit 0
fi

target_dir=${CARGO_TARGET_DIR:-$(pwd)/target}
for b in coordinator coordinatorctl bmc-gateway; do
  [ -x "$target_dir/debug/$b" ] || { echo "ci-debs: $target_dir/debug/$b missing: run scripts/test.sh first" >&2; exit 1; }
done
# (A no-op build when scripts/test.sh ran: it only prints where the binary is.)
own=$(scripts/build-agent.sh dev "$target_dir")
cp -f "$own" "$target_dir/debug/node-agent"

out="$target_dir/debian-ci"
rm -rf "$out"
mkdir -p "$out"
for pkg in fleetmend-node-agent fleetmend-coordinator fleetmend-bmc-gateway; do
  say "cargo deb --profile dev --no-build -p $pkg"
  # --fast: xz -1; the packages are thrown away after the check. cargo-deb warns that the
  # dev profile is not meant for releases, which is the point here (--quiet hides it).
  cargo deb --quiet --locked --no-build --profile dev --fast -p "$pkg" --output "$out" >/dev/null
done
say "packed in $((SECONDS - start)) s"
packaging/check-debs.sh "$out"/fleetmend-*.deb
say "ok in $((SECONDS - start)) s"
