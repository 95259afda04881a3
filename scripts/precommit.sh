#!/usr/bin/env bash
# What must be clean before a commit to main: formatting, clippy with warnings as errors,
# and the whole test suite (scripts/test.sh). CI (.ci/run) runs the same minus clippy, whose
# separate check build does not fit its time budget on a cold machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
exec scripts/test.sh "$@"
