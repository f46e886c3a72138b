#!/usr/bin/env bash
# Checks meta-holdfast with bitbake itself, offline, from an openembedded-core and a
# bitbake source tarball (the release the layer is for: wrynose, bitbake 2.18):
#   1. oe-core and meta-holdfast, MACHINE qemuarm64: `bitbake -p` parses every recipe;
#      `bitbake -e holdfast` gives the generated LICENSE (every name a licence oe-core
#      knows), every crate of holdfast-crates.inc in SRC_URI, no cni recommendation,
#      the board profile of qemuarm64; `bitbake -g holdfast packagegroup-holdfast`
#      resolves their dependencies (what fails with `Nothing RPROVIDES`).
#   2. the same with a stand-in meta-virtualization (collection virtualization-layer,
#      a cni recipe), MACHINE qemuarm: the dynamic-layers bbappend adds the cni
#      recommendation and the CNI network; qemuarm has no board profile.
#   3. oe-core's yocto-check-layer on meta-holdfast (oe-core alone).
# Nothing is fetched or compiled. bitbake refuses to run as root: run as root, the
# checks run as HOLDFAST_BITBAKE_USER (default `builder`, created when missing).
# Everything happens in a new temporary directory, removed at the end.
#
# Usage: yocto/check-bitbake.sh <openembedded-core.tar.xz> <bitbake.tar.xz>
# Host tools bitbake wants (Debian): chrpath diffstat gawk cpio lz4 zstd texinfo socat
# file locales (with en_US.UTF-8), python3, git.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 <openembedded-core.tar.xz> <bitbake.tar.xz>" >&2
  exit 2
fi
oe_tarball=$(realpath "$1")
bb_tarball=$(realpath "$2")

if [ -z "${HOLDFAST_CHECK_DIR:-}" ]; then
  layer=$(cd "$(dirname "$0")/meta-holdfast" && pwd)
  missing=""
  for tool in chrpath diffstat gawk cpio lz4 zstd makeinfo socat file python3 git tar xz; do
    command -v "$tool" >/dev/null || missing="$missing $tool"
  done
  if [ -n "$missing" ]; then
    echo "missing host tools:$missing (Debian: apt-get install chrpath diffstat gawk cpio lz4 zstd texinfo socat file locales)" >&2
    exit 1
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-bitbake.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cp -a "$layer" "$work/meta-holdfast"
  cp "$0" "$work/check-bitbake.sh"
  if [ "$(id -u)" = 0 ]; then
    user=${HOLDFAST_BITBAKE_USER:-builder}
    if ! id "$user" >/dev/null 2>&1; then
      useradd -m "$user"
    fi
    chown -R "$user": "$work"
    chmod 0755 "$work"
    # Both tarballs are read as the user: copy them in case their folder is private.
    cp "$oe_tarball" "$bb_tarball" "$work/"
    chown "$user": "$work"/*.tar.xz
    runuser -u "$user" -- env HOLDFAST_CHECK_DIR="$work" PATH="$PATH" \
      bash "$work/check-bitbake.sh" "$work/$(basename "$oe_tarball")" "$work/$(basename "$bb_tarball")"
  else
    HOLDFAST_CHECK_DIR="$work" bash "$work/check-bitbake.sh" "$oe_tarball" "$bb_tarball"
  fi
  exit $?
fi

# From here on: an ordinary user, in $HOLDFAST_CHECK_DIR, which holds meta-holdfast.
work=$HOLDFAST_CHECK_DIR
cd "$work"
export LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8
start=$(date +%s)
failures=0
step() { echo "== $(( $(date +%s) - start ))s: $*"; }
ok() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

step "unpacking $(basename "$oe_tarball") and $(basename "$bb_tarball")"
mkdir oe-core bitbake
tar -xf "$oe_tarball" -C oe-core --strip-components=1
tar -xf "$bb_tarball" -C bitbake --strip-components=1
common_licenses=$work/oe-core/meta/files/common-licenses

# A stand-in for meta-virtualization: its collection name and a cni recipe.
mkdir -p fake-virt/conf fake-virt/recipes-networking/cni
cat >fake-virt/conf/layer.conf <<'EOF'
BBPATH .= ":${LAYERDIR}"
BBFILES += "${LAYERDIR}/recipes-*/*/*.bb"
BBFILE_COLLECTIONS += "virtualization-layer"
BBFILE_PATTERN_virtualization-layer = "^${LAYERDIR}/"
BBFILE_PRIORITY_virtualization-layer = "8"
LAYERDEPENDS_virtualization-layer = "core"
LAYERSERIES_COMPAT_virtualization-layer = "wrynose"
EOF
cat >fake-virt/recipes-networking/cni/cni_1.0.bb <<'EOF'
SUMMARY = "Stand-in for meta-virtualization's CNI plugins"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"
INHIBIT_DEFAULT_DEPS = "1"
ALLOW_EMPTY:${PN} = "1"
EOF

# new_build <dir> <machine> <layer>...: a build dir with those layers.
new_build() {
  local dir=$1 machine=$2
  shift 2
  # oe-init-build-env reads unset variables and changes directory: a subshell.
  (
    set +u
    # shellcheck disable=SC1091
    . "$work/oe-core/oe-init-build-env" "$work/$dir" "$work/bitbake" >/dev/null
    cat >>conf/local.conf <<EOF
MACHINE = "$machine"
DISTRO = "nodistro"
INIT_MANAGER = "systemd"
BB_NO_NETWORK = "1"
EOF
    for l in "$@"; do
      bitbake-layers add-layer "$l" >/dev/null
    done
  )
  servers="$servers $dir"
}

# One bitbake server per build dir stays up between commands, so that the recipes are
# parsed once per build dir; stop_server ends it.
export BB_SERVER_TIMEOUT=300
servers=""
stop_servers() {
  local dir
  for dir in $servers; do
    in_build "$dir" bitbake -m >/dev/null 2>&1 || true
  done
  servers=""
}
trap stop_servers EXIT

# in_build <dir> <command>...: runs a command in a build dir's environment.
in_build() {
  local dir=$1
  shift
  (
    set +u
    # shellcheck disable=SC1091
    . "$work/oe-core/oe-init-build-env" "$work/$dir" "$work/bitbake" >/dev/null
    "$@"
  )
}

# value <env file> <variable>: a variable's final value from `bitbake -e` output.
value() {
  sed -n "s/^$2=\"\(.*\)\"\$/\1/p" "$1"
}

inc=$work/meta-holdfast/recipes-containers/holdfast/holdfast-crates.inc
want_license=$(sed -n 's/^HOLDFAST_LICENSE = "\(.*\)"$/\1/p' "$inc")
want_crates=$(grep -c '^    crate://crates.io/' "$inc")

# check_env <env file> <machine> <board> <with cni>: what `bitbake -e holdfast` says.
check_env() {
  local env=$1 machine=$2 board=$3 with_cni=$4
  local license src_uri rrecommends got_board crates
  license=$(value "$env" LICENSE)
  if [ -n "$want_license" ] && [ "$license" = "$want_license" ]; then
    ok "$machine: LICENSE = $license"
  else
    fail "$machine: LICENSE is \"$license\", holdfast-crates.inc has \"$want_license\""
  fi
  for name in $(echo "$license" | tr '&|()' '    '); do
    [ -f "$common_licenses/$name" ] || fail "$machine: LICENSE names $name, which oe-core has no text for"
  done
  src_uri=$(value "$env" SRC_URI)
  crates=$(echo "$src_uri" | tr ' ' '\n' | grep -c '^crate://crates.io/' || true)
  if [ "$crates" = "$want_crates" ] && echo "$src_uri" | grep -q 'git://'; then
    ok "$machine: SRC_URI has the git source and $crates crates"
  else
    fail "$machine: SRC_URI has $crates crates (holdfast-crates.inc: $want_crates): $src_uri"
  fi
  rrecommends=$(value "$env" 'RRECOMMENDS:holdfast')
  if [ "$with_cni" = yes ]; then
    if echo " $rrecommends " | grep -q ' cni ' && echo "$src_uri" | grep -q 'file://10-holdfast.conflist'; then
      ok "$machine: RRECOMMENDS:holdfast = $rrecommends, with the CNI network"
    else
      fail "$machine: with virtualization-layer, RRECOMMENDS:holdfast is \"$rrecommends\" and SRC_URI $src_uri"
    fi
  else
    if echo " $rrecommends " | grep -q ' cni ' || echo "$src_uri" | grep -q 'conflist'; then
      fail "$machine: without virtualization-layer, RRECOMMENDS:holdfast is \"$rrecommends\""
    else
      ok "$machine: RRECOMMENDS:holdfast = $rrecommends"
    fi
  fi
  got_board=$(value "$env" HOLDFAST_BOARD)
  if [ "$got_board" = "$board" ]; then
    ok "$machine: HOLDFAST_BOARD = \"$got_board\""
  else
    fail "$machine: HOLDFAST_BOARD is \"$got_board\", want \"$board\""
  fi
  # A package that ships a machine's profile is built for that machine only.
  local arch machine_arch
  arch=$(value "$env" PACKAGE_ARCH)
  machine_arch=$(value "$env" MACHINE_ARCH)
  if [ -n "$board" ] && [ "$arch" = "$machine_arch" ]; then
    ok "$machine: PACKAGE_ARCH = $arch (with a board profile)"
  elif [ -z "$board" ] && [ -n "$arch" ] && [ "$arch" != "$machine_arch" ]; then
    ok "$machine: PACKAGE_ARCH = $arch (no board profile)"
  else
    fail "$machine: PACKAGE_ARCH is \"$arch\" (MACHINE_ARCH $machine_arch, board \"$board\")"
  fi
}

# run <log> <command>...: runs a command, its output in <log>, and says how it went.
run() {
  local log=$1
  shift
  if "$@" >"$log" 2>&1; then
    ok "$*"
    return 0
  fi
  fail "$* (last lines of its output below)"
  tail -n 20 "$log" >&2
  return 1
}

step "oe-core + meta-holdfast, MACHINE qemuarm64: bitbake -p"
new_build build-core qemuarm64 "$work/meta-holdfast"
run parse-core.log in_build build-core bitbake -p && grep -h '^Parsing of' parse-core.log || true
step "bitbake -e holdfast"
if run env-core.log in_build build-core bitbake -e holdfast; then
  check_env env-core.log qemuarm64 arm64-vm no
fi
step "bitbake -g holdfast packagegroup-holdfast"
run graph-core.log in_build build-core bitbake -g holdfast packagegroup-holdfast || true

step "oe-core + virtualization-layer stand-in + meta-holdfast, MACHINE qemuarm: bitbake -e holdfast"
new_build build-virt qemuarm "$work/fake-virt" "$work/meta-holdfast"
if run env-virt.log in_build build-virt bitbake -e holdfast; then
  check_env env-virt.log qemuarm "" yes
fi
run graph-virt.log in_build build-virt bitbake -g holdfast packagegroup-holdfast || true
stop_servers

step "yocto-check-layer meta-holdfast (oe-core alone, MACHINE qemuarm64)"
new_build build-check qemuarm64
if in_build build-check yocto-check-layer --no-auto-dependency "$work/meta-holdfast" >check-layer.log 2>&1; then
  ok "yocto-check-layer"
else
  fail "yocto-check-layer (its output below)"
fi
grep -E '^(INFO: )?(test_|Ran |OK|FAILED)|INFO: *(layer|meta-holdfast|Summary)|\.\.\. (ok|FAIL|ERROR|skipped)' check-layer.log || tail -n 40 check-layer.log

step "done: $failures failure(s)"
[ "$failures" = 0 ]
