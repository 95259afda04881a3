#!/usr/bin/env bash
# Checks the packages made by packaging/build-debs.sh (${CARGO_TARGET_DIR:-target}/debian/*.deb):
#   1. dpkg-deb --info and --contents of each;
#   2. lintian: no errors (warnings are printed);
#   3. in a throwaway root, per package: install, reinstall (the upgrade path of the
#      maintainer scripts), `systemd-analyze verify` and `systemd-analyze security --offline`
#      on the installed unit, remove, purge; then nothing may be left behind.
#   4. with --release only: no test-only code ships (the coordinator must not contain the
#      crash tests' kill-point variable FLEETMEND_FENCE_KILL_AT, compiled in only by the
#      coordinator's `failpoints` feature). Packages of a debug workspace build
#      (packaging/ci-debs.sh) may carry it, as the tests crate enables that feature, so the
#      check applies to release packages (packaging/build-debs.sh) only.
# Installs what it needs with apt (lintian; systemd for systemd-analyze). Runs as root.
#
# The throwaway root is the host's own root under a copy-on-write overlay in a private mount
# namespace (unshare -m): dpkg runs chrooted into it, every write lands in the overlay's upper
# directory, and that directory is exactly "what the package changed". No network and no
# debootstrap are needed, and the host is never touched. There is no running systemd in the
# root (no /run/systemd/system), as in any chroot, so the maintainer scripts take their
# offline paths: deb-systemd-helper enable/purge without start/stop.
#
# A package the host itself has installed is purged first inside the throwaway root (the
# host keeps it); what that purge changed is the baseline the leftovers are compared with.
#
# Writes the exposure scores to security.txt next to the (first) package.
# Usage: packaging/check-debs.sh [--release] [DEB...]   (default: ${CARGO_TARGET_DIR:-target}/debian/fleetmend-*.deb)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
. packaging/lib.sh

say() { echo "check-debs: $*"; }
fail() { echo "check-debs: FAIL: $*" >&2; exit 1; }

# What an overlay's upper directory ($1) holds that differs from the host's root (its lower
# layer), one sorted line each: a file or link that is new or changed, a directory that is
# new ("dir/"), or "removed from the host root: path" for a whiteout. dpkg's own bookkeeping
# and logs, the shadow-utils backup files (/etc/passwd- and friends) and the mount points of
# the namespace are expected and not listed.
leftovers() {
  local upper=$1
  {
    (cd "$upper" && find . -mindepth 1 \( -type f -o -type l -o -type c \) | sed 's|^\./|/|') |
      grep -Ev '^/(var/lib/dpkg/|var/log/|var/cache/debconf/|tmp/|run/|proc/|dev/)' |
      grep -Ev '^/etc/(passwd|group|shadow|gshadow|subuid|subgid)-$' |
      while read -r f; do
        up="$upper$f"
        if [ -c "$up" ]; then
          echo "removed from the host root: $f"
        elif [ -L "$up" ]; then
          [ -L "$f" ] && [ "$(readlink "$up")" = "$(readlink "$f")" ] || echo "$f"
        elif [ -f "$f" ] && cmp -s "$up" "$f"; then
          :
        else
          echo "$f"
        fi
      done
    (cd "$upper" && find . -mindepth 1 -type d | sed 's|^\./|/|') |
      grep -Ev '^/(var/lib/dpkg|var/log|var/cache/debconf|tmp|run|proc|dev)(/|$)' |
      while read -r d; do [ -d "$d" ] || echo "$d/"; done
  } | LC_ALL=C sort || true
}

[ "$(id -u)" = 0 ] || fail "run as root (dpkg in a throwaway root, apt-get)"

ensure_apt lintian:lintian systemd-analyze:systemd

release=0
debs=()
for a in "$@"; do
  case "$a" in
    --release) release=1 ;;
    -*) echo "usage: $0 [--release] [DEB...]" >&2; exit 2 ;;
    *) debs+=("$a") ;;
  esac
done
# Where packaging/build-debs.sh writes them (it honours CARGO_TARGET_DIR too).
deb_dir=${CARGO_TARGET_DIR:-target}/debian
[ ${#debs[@]} -gt 0 ] || debs=("$deb_dir"/fleetmend-*.deb)
[ -e "${debs[0]}" ] || fail "no packages in $deb_dir: run packaging/build-debs.sh first (with the same CARGO_TARGET_DIR)"

# A failed check leaves no throwaway root behind (its mounts die with their namespace).
work=
trap '[ -z "$work" ] || rm -rf "$work"' EXIT

out_dir=$(dirname "$(realpath "${debs[0]}")")
report="$out_dir/security.txt"
: >"$report"

for deb in "${debs[@]}"; do
  deb=$(realpath "$deb")
  pkg=$(dpkg-deb --field "$deb" Package)
  say "== $pkg ($(basename "$deb"))"
  # The throwaway root is the host's root under an overlay: with the package on the host
  # too, its install would be an upgrade and its purge would remove the host's files. So it
  # is purged in the throwaway root first, and the leftovers are counted from there.
  host_status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  case "$host_status" in
    "" | *not-installed) on_host=0 ;;
    *) on_host=1; say "$pkg is on this host ($host_status): purged first in the throwaway root only; the host keeps it" ;;
  esac
  dpkg-deb --info "$deb"
  dpkg-deb --contents "$deb"

  # Tags that only make sense for packages built from a Debian source package (changelog,
  # manual pages, the archive's copyright format) are not errors for a vendor package;
  # lintian still prints everything else, and any error fails the check.
  say "lintian $pkg"
  lintian --fail-on error --no-tag-display-limit \
    --suppress-tags no-manual-page,no-changelog,debian-changelog-file-missing-or-wrong-name \
    "$deb"

  if [ "$release" = 1 ]; then
    # The variable's name is a string literal only where the kill points are compiled in.
    # grep -c reads to the end: with -q, tar would die of SIGPIPE and pipefail hide the hit.
    for b in $(dpkg-deb --contents "$deb" | awk '{print $NF}' | grep '^\./usr/bin/.'); do
      hits=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO "$b" | grep -ac FLEETMEND_FENCE_KILL_AT || true)
      [ "${hits:-0}" = 0 ] || fail "$pkg: ${b#.} contains the test-only kill points (feature failpoints)"
    done
    say "$pkg: no test-only kill points in its binaries"
  fi

  unit_path=$(dpkg-deb --contents "$deb" | awk '{print $NF}' | grep -E '^\./(usr/)?lib/systemd/system/[^/]+\.service$' | head -n1 | sed 's|^\.||')
  unit=$(basename "${unit_path:-none}")
  [ -n "$unit_path" ] || fail "$pkg ships no systemd unit"

  work=$(mktemp -d /tmp/check-debs.XXXXXX)
  mkdir -p "$work/upper" "$work/work" "$work/root"
  # Everything below runs in a private mount namespace: the overlay and its bind mounts
  # vanish with it.
  # (The script is an argument, not stdin: dpkg and friends read their stdin.)
  inner=$(declare -f leftovers; cat <<'INNER'
mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=/,upperdir=$W/upper,workdir=$W/work" "$W/root"
mount -t proc proc "$W/root/proc"
mount --rbind /dev "$W/root/dev"
mount -t tmpfs tmpfs "$W/root/tmp"
mount -t tmpfs tmpfs "$W/root/run"
cp "$DEB" "$W/root/tmp/pkg.deb"
in_root() { chroot "$W/root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

: >"$W/baseline"
if [ "$ON_HOST" = 1 ]; then
  echo "check-debs: dpkg --purge $PKG (the host's copy, in the throwaway root)"
  in_root dpkg --purge "$PKG"
  leftovers "$W/upper" >"$W/baseline"
fi

echo "check-debs: dpkg -i $PKG (install)"
in_root dpkg -i /tmp/pkg.deb
echo "check-debs: dpkg -i $PKG (again: the upgrade path)"
in_root dpkg -i /tmp/pkg.deb
in_root dpkg-query -W -f='${Status}\n' "$PKG" | grep -qx 'install ok installed'
# Enabled on install (deb-systemd-helper's symlink), not running (no systemd here).
in_root test -L "/etc/systemd/system/multi-user.target.wants/$UNIT" ||
  { echo "check-debs: FAIL: $UNIT not enabled after install" >&2; exit 1; }
for b in $(in_root dpkg -L "$PKG" | grep '^/usr/bin/'); do
  in_root "$b" --version
done
if [ "$PKG" = fleetmend-coordinator ]; then
  in_root getent passwd fleetmend >/dev/null ||
    { echo "check-debs: FAIL: no fleetmend user after install" >&2; exit 1; }
  # The store's directory exists before the first start, so `coordinator check` on an
  # unprovisioned host (no certificate yet: its TLS line fails) finds it writable by the
  # service user.
  [ "$(in_root stat -c '%U:%G %a' /var/lib/fleetmend/coordinator)" = "fleetmend:fleetmend 750" ] ||
    { echo "check-debs: FAIL: /var/lib/fleetmend/coordinator missing or not fleetmend's, 0750" >&2; exit 1; }
  check_out=$(in_root runuser -u fleetmend -- coordinator check 2>&1 || true)
  echo "$check_out"
  echo "$check_out" | grep -q '^database *ok ' ||
    { echo "check-debs: FAIL: coordinator check does not find the database directory writable" >&2; exit 1; }
fi

echo "check-debs: systemd-analyze verify $UNIT"
in_root systemd-analyze verify "$UNIT_PATH"
echo "check-debs: systemd-analyze security --offline=true $UNIT"
in_root systemd-analyze security --offline=true --no-pager "$UNIT_PATH" >"$W/security.txt" || true
cat "$W/security.txt"

echo "check-debs: dpkg --remove, --purge $PKG"
in_root dpkg --remove "$PKG"
in_root dpkg --purge "$PKG"
if in_root dpkg-query -W "$PKG" >/dev/null 2>&1; then
  in_root dpkg-query -W -f='${Status}\n' "$PKG" | grep -q 'not-installed' ||
    { echo "check-debs: FAIL: $PKG still known to dpkg after purge" >&2; exit 1; }
fi
leftovers "$W/upper" >"$W/after"
INNER
)
  unshare -m env PKG="$pkg" DEB="$deb" UNIT="$unit" UNIT_PATH="$unit_path" W="$work" ON_HOST="$on_host" \
    bash -euo pipefail -c "$inner" </dev/null
  # What the package left behind: what the upper layer holds at the end that it did not
  # hold before the install (nothing, or the purge of the host's copy).
  left=$(comm -13 "$work/baseline" "$work/after")
  if [ -n "$left" ]; then
    printf '%s\n' "$left" >&2
    fail "$pkg: purge left the above behind"
  fi
  say "$pkg: install, reinstall, remove, purge: nothing left behind"
  exposure=$(grep -o 'Overall exposure level for .*' "$work/security.txt" || echo "no exposure reported for $unit")
  echo "$pkg $exposure" | tee -a "$report"
  cp "$work/security.txt" "$out_dir/security-$unit.txt"
  rm -rf "$work"
  work=
done
n=${#debs[@]}
say "ok: $n package$([ "$n" = 1 ] || echo s); exposure in $report"
