# Shared by packaging/build-debs.sh and packaging/ci-debs.sh (sourced, not run).

# Pinned so every machine builds the same package layout; 3.x is the first line that
# needs a Rust as new as the workspace's anyway.
CARGO_DEB_VERSION=3.6.2

# Installs cargo-deb $CARGO_DEB_VERSION from crates.io unless that version is already on the
# PATH. The cheapest build that makes the same packages (measured in docs/packaging.md):
# - `--no-default-features` leaves out the bundled liblzma (a C build) and the build-id
#   reader for dbgsym packages; cargo-deb then compresses with the system's `xz`
#   (xz-utils, which lintian depends on anyway), into the same .deb format;
# - `--debug`: cargo-deb only copies, strips (with binutils) and packs a few files, so an
#   unoptimised build of it is as good and compiles in a third of the time.
ensure_cargo_deb() {
  local have
  have=$(cargo deb --version 2>/dev/null | awk '{print $2}' || true)
  if [ "$have" = "$CARGO_DEB_VERSION" ]; then
    return 0
  fi
  echo "packaging: installing cargo-deb $CARGO_DEB_VERSION (found: ${have:-none})" >&2
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --quiet \
    --no-default-features --debug
}

# Installs, with apt, the Debian packages whose commands are missing: ensure_apt CMD:PKG...
ensure_apt() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  echo "packaging: apt-get install ${need[*]}" >&2
  env DEBIAN_FRONTEND=noninteractive apt-get update -q
  env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" </dev/null
}
