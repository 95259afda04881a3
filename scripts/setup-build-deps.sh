#!/usr/bin/env bash
# Installs what building the workspace needs beyond the Rust toolchain: `protoc` (Debian
# `protobuf-compiler`) and protobuf's well-known types (`google/protobuf/descriptor.proto`
# and the rest, Debian `libprotobuf-dev`: `protobuf-compiler` only recommends it, so an
# install without recommends lacks them), which the etcd client crate's build script needs to
# compile etcd's gRPC .proto files for the coordinator's etcd store driver. Idempotent:
# returns at once when both are there. Installs with apt-get as root (or with sudo -n); otherwise says what to run.
# Called by .ci/run before its build, by scripts/setup-test-deps.sh and scripts/demo.sh
# (packaging/build-debs.sh installs it with its own ensure_apt).
set -euo pipefail
# The well-known types where protoc looks by default (next to its own prefix).
have_wkt() {
  local bin
  bin=$(command -v protoc 2>/dev/null) || return 1
  [ -f "$(dirname "$(dirname "$bin")")/include/google/protobuf/descriptor.proto" ] ||
    [ -f /usr/include/google/protobuf/descriptor.proto ]
}
if [ -n "${PROTOC:-}" ] || have_wkt; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "setup-build-deps: protoc or protobuf's well-known types are missing and this user cannot install packages; as root run:" >&2
    echo "  apt-get install protobuf-compiler libprotobuf-dev" >&2
    exit 1
  fi
fi
echo "setup-build-deps: apt-get install protobuf-compiler libprotobuf-dev (protoc and its well-known types, for the etcd client's build)" >&2
install() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends protobuf-compiler libprotobuf-dev </dev/null >/dev/null
}
install 2>/dev/null || { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && install; }
have_wkt || { echo "setup-build-deps: protoc or google/protobuf/descriptor.proto still missing after apt-get" >&2; exit 1; }
