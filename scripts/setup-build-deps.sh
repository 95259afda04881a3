#!/usr/bin/env bash
# Installs what building the workspace needs beyond the Rust toolchain: `protoc` (Debian
# `protobuf-compiler`), which the etcd client crate's build script runs to compile etcd's
# gRPC .proto files for the coordinator's etcd store driver. Idempotent: returns at once when
# protoc is there. Installs with apt-get as root (or with sudo -n); otherwise says what to run.
# Called by .ci/run before its build, by scripts/setup-test-deps.sh and scripts/demo.sh
# (packaging/build-debs.sh installs it with its own ensure_apt).
set -euo pipefail
if command -v protoc >/dev/null 2>&1 || [ -n "${PROTOC:-}" ]; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "setup-build-deps: protoc is missing and this user cannot install packages; as root run:" >&2
    echo "  apt-get install protobuf-compiler" >&2
    exit 1
  fi
fi
echo "setup-build-deps: apt-get install protobuf-compiler (protoc, for the etcd client's build)" >&2
install() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends protobuf-compiler </dev/null >/dev/null
}
install 2>/dev/null || { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && install; }
command -v protoc >/dev/null 2>&1 || { echo "setup-build-deps: protoc still missing after apt-get" >&2; exit 1; }
