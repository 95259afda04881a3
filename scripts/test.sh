#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs the test peers, then cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/setup-test-deps.sh ]; then
  scripts/setup-test-deps.sh
fi
exec cargo test --workspace "$@"
