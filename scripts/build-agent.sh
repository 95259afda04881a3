#!/usr/bin/env bash
# Builds node-agent as it ships and prints the binary's path on stdout (cargo's own output
# goes to stderr):
#   - on its own (`-p fleetmend-node-agent`), in a target directory of its own choosing:
#     built with the rest of the workspace, cargo would unify the other crates' dependency
#     features into the agent (a larger binary, more resident memory on every server);
#   - linked statically against glibc (`-C target-feature=+crt-static`). The agent's
#     resident memory is mostly mapped code: dynamically linked, every page of libc.so and
#     ld.so it touches (and its neighbours, by fault-around) counts, about 1.5 MiB; linked
#     statically, only the parts of libc it calls are in the binary (docs/benchmarks.md).
#     Name resolution still works: glibc 2.34 and later have the `files` and `dns` sources
#     built in, which is what the agent's lookup of the coordinator's address uses.
#     crt-static needs an explicit --target, so that build scripts and proc-macros (run by
#     cargo on this machine, dynamically linked) do not get the flag.
#   - for the `agent` profile (the package), with its relative relocations packed
#     (`-z pack-relative-relocs`, DT_RELR): a static position-independent binary carries a
#     24-byte relocation for every pointer in its data that the start code fixes up, about
#     175 KB of the agent's 4 MB; packed, they take about 2 KB. The binary is still PIE
#     (loaded at a random address), and the relocating is done by the static glibc linked
#     into it (2.36 and later read DT_RELR), so the server's own libc does not matter. Needs
#     binutils 2.38 or later. Only this profile: a change of flags rebuilds every dependency,
#     and the tests' dev build is left as it is (docs/benchmarks.md).
#
# Usage: scripts/build-agent.sh PROFILE [TARGET_DIR]
#   PROFILE: dev (the tests and CI's packages), agent (the released package, Cargo.toml's
#   [profile.agent]) or release. TARGET_DIR defaults to $CARGO_TARGET_DIR or target/.
# The binary is TARGET_DIR/<host triple>/<profile directory>/node-agent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
profile=${1:?usage: scripts/build-agent.sh PROFILE [TARGET_DIR]}
target_dir=${2:-${CARGO_TARGET_DIR:-$root/target}}
case "$profile" in
  dev) dir=debug ;;
  agent | release) dir=$profile ;;
  *) echo "build-agent: unknown profile $profile (dev, agent or release)" >&2; exit 2 ;;
esac
triple=$(rustc -vV | sed -n 's/^host: //p')
flags="-C target-feature=+crt-static"
[ "$profile" = agent ] && flags="$flags -C link-arg=-Wl,-z,pack-relative-relocs"
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }$flags" \
  CARGO_TARGET_DIR="$target_dir" \
  cargo build --locked --profile "$profile" --target "$triple" -p fleetmend-node-agent --bins \
  --manifest-path "$root/Cargo.toml" >&2
echo "$target_dir/$triple/$dir/node-agent"
