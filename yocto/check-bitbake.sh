#!/usr/bin/env bash
# Checks meta-holdfast with bitbake itself, offline, from an openembedded-core and a
# bitbake source tarball (the release the layer is for: wrynose, bitbake 2.18).
#
# Build dir build-arm64 (oe-core and meta-holdfast, MACHINE qemuarm64), one bitbake
# server kept up, the recipes parsed once (a cold parse is 2 to 4 minutes on two
# cores; every later command reads that parse):
#   - `bitbake -p` parses every recipe, with oe-core's yocto-check-layer class
#     inherited (its per-recipe checks);
#   - `bitbake -e holdfast` (the release recipe) and `bitbake -e -b holdfast_git.bb`
#     (the development recipe) give the generated LICENSE (every name a licence
#     oe-core knows), every crate of the recipe's crates .inc in SRC_URI (and the git
#     source for the release), no cni recommendation, holdfast built per architecture and
#     holdfast-board with qemuarm64's board profile, the
#     `seccomp` feature and libseccomp (nodistro has the `seccomp` distro feature) and
#     a PIE executable;
#   - `bitbake -e -b holdfast-image.bb` installs packagegroup-holdfast, with room for a
#     pod (DISTRO_FEATURES has "holdfast" here, which the image requires);
#     `bitbake -e virtual/kernel`: linux-yocto takes the layer's kernel fragment;
#     `bitbake -g holdfast packagegroup-holdfast holdfast-image` resolves their
#     dependencies (what fails with `Nothing RPROVIDES`);
#   - `bitbake holdfast -c patch`: the release's git source from a local clone of this
#     repository (a PREMIRRORS entry for the recipe's own git:// URL) and every crate
#     from Cargo's download cache, each checked against the .inc's sha256sum by the
#     fetcher; no 32-bit patch on aarch64;
#   - yocto-check-layer's tests that need no world build (check-layer-subset.py).
# Before either: the layer's oeqa runtime case loads with oe-core's oeqa (testimage
# runs it in a booted image on a build machine: lib/oeqa/runtime/cases/holdfast.py).
# Build dir build-arm (oe-core, a stand-in meta-virtualization and meta-holdfast,
# MACHINE qemuarm), oe-core's recipes masked (no second parse of every recipe; tasks
# run with `bitbake -b`, without the dependency resolution build-arm64 did):
#   - both recipes' variables (recipe-env.py, as `bitbake -e` gives them): the
#     dynamic-layers bbappend adds the cni recommendation and the CNI network;
#     qemuarm has no board profile; a distro without `seccomp` builds holdfast without
#     the feature and libseccomp; HOLDFAST_PIE = "0" makes it non-PIE;
#     HOLDFAST_DATA_DEVICE enables the state partition's mount unit;
#   - the release's `-c patch` and the development recipe's `-c unpack` apply the
#     armv7 patches of holdfast_patch_crates to libcontainer and libcgroups, read from
#     the task logs.
# With HOLDFAST_CHECK_LAYER_FULL=1, oe-core's yocto-check-layer also runs whole (its
# world builds and signature checks: about 11 more minutes on two cores).
#
# Nothing is compiled. do_patch wants quilt-native: the host's quilt stands in for it
# (ASSUME_PROVIDED, HOSTTOOLS). bitbake refuses to run as root: run as root, the checks
# run as HOLDFAST_BITBAKE_USER (default `builder`, created when missing). Everything
# happens in a new directory under ${TMPDIR:-/var/tmp}, removed at the end.
#
# Usage: yocto/check-bitbake.sh <openembedded-core.tar.xz> <bitbake.tar.xz>
# Host tools (Debian): chrpath diffstat gawk cpio lz4 zstd texinfo socat file locales
# (with en_US.UTF-8) quilt, python3, git, cargo (for a crate missing from its cache).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 <openembedded-core.tar.xz> <bitbake.tar.xz>" >&2
  exit 2
fi
oe_tarball=$(realpath "$1")
bb_tarball=$(realpath "$2")
# The URL the release recipe fetches (HOLDFAST_GIT_REPO's default).
git_url=git://github.com/holdfast-agent/holdfast.git

if [ -z "${HOLDFAST_CHECK_DIR:-}" ]; then
  repo=$(cd "$(dirname "$0")/.." && pwd)
  recipes=$repo/yocto/meta-holdfast/recipes-containers/holdfast
  missing=""
  for tool in chrpath diffstat gawk cpio lz4 zstd makeinfo socat file quilt python3 git tar xz; do
    command -v "$tool" >/dev/null || missing="$missing $tool"
  done
  if [ -n "$missing" ]; then
    echo "missing host tools:$missing (Debian: apt-get install chrpath diffstat gawk cpio lz4 zstd texinfo socat file locales quilt)" >&2
    exit 1
  fi
  start=$(date +%s)
  work=$(mktemp -d "${TMPDIR:-/var/tmp}/holdfast-bitbake.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "== 0s: copying the checkout, a bare clone of it and the crates into $work"
  # The working tree as it is (tracked and untracked files, not ignored ones): the
  # layer, and the checkout the development recipe builds.
  mkdir "$work/src" "$work/downloads"
  (
    cd "$repo"
    git ls-files -z --cached --others --exclude-standard --deduplicate |
      while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
      tar --null -T - -cf -
  ) | tar -xf - -C "$work/src"
  # The release's source: a bare clone whose main is this checkout's HEAD.
  srcrev=$(sed -n 's/^SRCREV = "\([0-9a-f]*\)"$/\1/p' "$recipes"/holdfast_[0-9]*.bb)
  if ! git -C "$repo" cat-file -e "$srcrev^{commit}" 2>/dev/null; then
    echo "the release recipe's SRCREV $srcrev is not in this clone (a shallow clone? git fetch --unshallow)" >&2
    exit 1
  fi
  git clone --quiet --bare --no-hardlinks "$repo" "$work/holdfast.git"
  git -C "$work/holdfast.git" update-ref refs/heads/main "$(git -C "$repo" rev-parse HEAD)"
  # The release recipe fetches tag v<PV> and the fetcher checks that it names SRCREV.
  # The mirror stands in for the project's repository, where the release is tagged: a
  # clone without tags gets the tag here (gen-crates-inc.py --check-release has checked
  # that SRCREV is the commit that made that version).
  release_pv=$(basename "$recipes"/holdfast_[0-9]*.bb .bb | cut -d_ -f2)
  if ! git -C "$work/holdfast.git" rev-parse --verify --quiet "refs/tags/v$release_pv" >/dev/null; then
    git -C "$work/holdfast.git" tag "v$release_pv" "$srcrev"
  fi
  # The crates of both recipes' .inc files, from Cargo's download cache, named as the
  # crate fetcher names them (<name>-<version>.crate). The .done stamp is empty: the
  # fetcher then computes the file's sha256 and compares it with the recipe's
  # SRC_URI[<name>-<version>.sha256sum] before it uses the file.
  mapfile -t crates < <(sed -n 's,^    crate://crates.io/\([^/]*\)/\([^ ]*\) \\$,\1-\2,p' "$recipes"/holdfast*-crates.inc | sort -u)
  cargo_cache() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/index.crates.io-*/ 2>/dev/null || true; }
  copy_crates() {
    local c dir absent=0
    for c in "${crates[@]}"; do
      [ -f "$work/downloads/$c.crate" ] && continue
      for dir in $(cargo_cache); do
        if [ -f "$dir/$c.crate" ]; then
          cp "$dir/$c.crate" "$work/downloads/$c.crate"
          : >"$work/downloads/$c.crate.done"
          break
        fi
      done
      [ -f "$work/downloads/$c.crate" ] || absent=$((absent + 1))
    done
    return "$absent"
  }
  if ! copy_crates; then
    echo "some crates are not in Cargo's cache: cargo fetch --locked (this checkout and SRCREV)"
    cargo fetch --locked --manifest-path "$repo/Cargo.toml" >/dev/null
    mkdir "$work/rev"
    git -C "$repo" archive "$srcrev" | tar -xf - -C "$work/rev"
    cargo fetch --locked --manifest-path "$work/rev/Cargo.toml" >/dev/null
    rm -rf "$work/rev"
    if ! copy_crates; then
      echo "crates of the .inc files are missing from Cargo's cache after cargo fetch" >&2
      exit 1
    fi
  fi
  echo "== $(($(date +%s) - start))s: ${#crates[@]} crates in DL_DIR"
  status=0
  if [ "$(id -u)" = 0 ]; then
    user=${HOLDFAST_BITBAKE_USER:-builder}
    if ! id "$user" >/dev/null 2>&1; then
      useradd -m "$user"
    fi
    # Both tarballs are read as the user: copy them in case their folder is private.
    cp "$oe_tarball" "$bb_tarball" "$work/"
    chown -R "$user": "$work"
    chmod 0755 "$work"
    runuser -u "$user" -- env HOLDFAST_CHECK_DIR="$work" PATH="$PATH" \
      HOLDFAST_CHECK_LAYER_FULL="${HOLDFAST_CHECK_LAYER_FULL:-}" \
      bash "$work/src/yocto/check-bitbake.sh" "$work/$(basename "$oe_tarball")" "$work/$(basename "$bb_tarball")" ||
      status=$?
  else
    HOLDFAST_CHECK_DIR="$work" bash "$work/src/yocto/check-bitbake.sh" "$oe_tarball" "$bb_tarball" || status=$?
  fi
  echo "== $(($(date +%s) - start))s in all"
  exit "$status"
fi

# From here on: an ordinary user, in $HOLDFAST_CHECK_DIR, which holds src/ (the
# checkout), holdfast.git and downloads/.
work=$HOLDFAST_CHECK_DIR
cd "$work"
export LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8
layer=$work/src/yocto/meta-holdfast
recipes=$layer/recipes-containers/holdfast
release_bb=$(ls "$recipes"/holdfast_[0-9]*.bb)
git_bb=$recipes/holdfast_git.bb
image_bb=$layer/recipes-core/images/holdfast-image.bb
board_bb=$recipes/holdfast-board_1.0.bb
failures=0
timings=""
step_name=""
step_start=$(date +%s)
# step <name>: starts a timed step (and ends the one before).
step() {
  local now
  now=$(date +%s)
  if [ -n "$step_name" ]; then
    timings="$timings$(printf '%5ss  %s' "$((now - step_start))" "$step_name")"$'\n'
  fi
  step_name=$*
  step_start=$now
  [ -n "$step_name" ] && echo "== $*"
  return 0
}
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

# The layer's runtime test (lib/oeqa/runtime/cases/holdfast.py), which testimage runs in
# a booted image: it loads with oe-core's oeqa as testimage loads a layer's cases.
if PYTHONPATH="$work/oe-core/meta/lib:$work/bitbake/lib" python3 - \
  "$layer/lib/oeqa/runtime/cases" >oeqa.log 2>&1 <<'EOF'
import importlib, sys, unittest
import oeqa.runtime.cases
oeqa.runtime.cases.__path__.append(sys.argv[1])
case = importlib.import_module("oeqa.runtime.cases.holdfast").HoldfastTest
names = unittest.TestLoader().getTestCaseNames(case)
want = {"test_holdfast_check", "test_br_netfilter_loaded_at_boot", "test_agent_runs_and_answers"}
assert want <= set(names), names
print(" ".join(names))
EOF
then
  ok "oeqa runtime case holdfast: $(tail -n 1 oeqa.log)"
else
  fail "oeqa runtime case holdfast does not load with oe-core's oeqa: $(cat oeqa.log)"
fi

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

# new_build <dir> <machine> <more local.conf> <layer>...: a build dir with those layers.
new_build() {
  local dir=$1 machine=$2 more=$3
  shift 3
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
DL_DIR = "$work/downloads"
# No uninative tarball offline: the host's libc for native tools.
INHERIT:remove = "uninative"
# yocto-check-layer's per-recipe checks, in every parse.
INHERIT += "yocto-check-layer"
# The release's git source from a local clone of this repository.
PREMIRRORS:prepend = "$git_url git://$work/holdfast.git;protocol=file "
# do_patch runs quilt: the host's, instead of building quilt-native.
ASSUME_PROVIDED += "quilt-native patch-replacement-native"
HOSTTOOLS += "quilt"
QUILTRCFILE = "/dev/null"
$more
EOF
    for l in "$@"; do
      if ! bitbake-layers add-layer "$l" >"$work/add-layer.log" 2>&1; then
        cat "$work/add-layer.log" >&2
        echo "FAIL: bitbake-layers add-layer $l in $dir" >&2
        exit 1
      fi
    done
  )
  servers="$servers $dir"
}

# One bitbake server per build dir stays up between commands, so that the recipes are
# parsed once per build dir; stop_servers ends them.
export BB_SERVER_TIMEOUT=600
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

# value <env file> <variable>: a variable's final value from `bitbake -e` output (an
# exported one is printed `export NAME="..."`).
value() {
  sed -n "s/^\(export \)\{0,1\}$2=\"\(.*\)\"\$/\2/p" "$1"
}

# check_env <env file> <label> <crates .inc> <unused> <with cni> <git source>: what
# `bitbake -e` says of a holdfast recipe.
check_env() {
  local env=$1 label=$2 inc=$3 board=$4 with_cni=$5 with_git=$6
  local want_license want_crates license src_uri rrecommends got_board crates
  want_license=$(sed -n 's/^HOLDFAST_LICENSE = "\(.*\)"$/\1/p' "$inc")
  want_crates=$(grep -c '^    crate://crates.io/' "$inc")
  license=$(value "$env" LICENSE)
  if [ -n "$want_license" ] && [ "$license" = "$want_license" ]; then
    ok "$label: LICENSE = $license"
  else
    fail "$label: LICENSE is \"$license\", $(basename "$inc") has \"$want_license\""
  fi
  for name in $(echo "$license" | tr '&|()' '    '); do
    [ -f "$common_licenses/$name" ] || fail "$label: LICENSE names $name, which oe-core has no text for"
  done
  src_uri=$(value "$env" SRC_URI)
  crates=$(echo "$src_uri" | tr ' ' '\n' | grep -c '^crate://crates.io/' || true)
  if [ "$crates" != "$want_crates" ]; then
    fail "$label: SRC_URI has $crates crates ($(basename "$inc"): $want_crates): $src_uri"
  elif [ "$with_git" = yes ] && ! echo "$src_uri" | grep -q "$git_url;"; then
    fail "$label: SRC_URI has no $git_url: $src_uri"
  elif [ "$with_git" = no ] && echo "$src_uri" | grep -q 'git://'; then
    fail "$label: SRC_URI fetches git, externalsrc should have dropped it: $src_uri"
  else
    ok "$label: SRC_URI has $crates crates$([ "$with_git" = yes ] && echo " and the git source")"
  fi
  rrecommends=$(value "$env" 'RRECOMMENDS:holdfast')
  if [ "$with_cni" = yes ]; then
    if echo " $rrecommends " | grep -q ' cni ' && echo "$src_uri" | grep -q 'file://10-holdfast.conflist'; then
      ok "$label: RRECOMMENDS:holdfast = $rrecommends, with the CNI network"
    else
      fail "$label: with virtualization-layer, RRECOMMENDS:holdfast is \"$rrecommends\" and SRC_URI $src_uri"
    fi
  else
    if echo " $rrecommends " | grep -q ' cni ' || echo "$src_uri" | grep -q 'conflist'; then
      fail "$label: without virtualization-layer, RRECOMMENDS:holdfast is \"$rrecommends\""
    else
      ok "$label: RRECOMMENDS:holdfast = $rrecommends"
    fi
  fi
  # holdfast is built per architecture: the MACHINE's board profile is holdfast-board's.
  local arch machine_arch
  arch=$(value "$env" PACKAGE_ARCH)
  machine_arch=$(value "$env" MACHINE_ARCH)
  if [ -n "$arch" ] && [ "$arch" != "$machine_arch" ] && [ -z "$(value "$env" HOLDFAST_BOARD)" ]; then
    ok "$label: PACKAGE_ARCH = $arch, not the MACHINE's $machine_arch"
  else
    fail "$label: PACKAGE_ARCH is \"$arch\" (MACHINE_ARCH $machine_arch, HOLDFAST_BOARD \"$(value "$env" HOLDFAST_BOARD)\")"
  fi
}

# check_board <env file> <label> <board>: what `bitbake -e` says of holdfast-board: the
# MACHINE's profile (or none), built for that MACHINE.
check_board() {
  local env=$1 label=$2 board=$3 got arch machine_arch
  got=$(value "$env" HOLDFAST_BOARD)
  arch=$(value "$env" PACKAGE_ARCH)
  machine_arch=$(value "$env" MACHINE_ARCH)
  if [ "$got" = "$board" ] && [ "$arch" = "$machine_arch" ]; then
    ok "$label: holdfast-board: HOLDFAST_BOARD = \"$got\", PACKAGE_ARCH = $arch"
  else
    fail "$label: holdfast-board: HOLDFAST_BOARD is \"$got\" (want \"$board\"), PACKAGE_ARCH \"$arch\" (MACHINE_ARCH $machine_arch)"
  fi
}

# check_flags <env file> <label> <seccomp: yes|no> <non-PIE: yes|no>: how the recipe
# builds holdfast, from `bitbake -e`: the `seccomp` feature and libseccomp only with the
# distro's `seccomp`, Cargo's default features off, libseccomp from the sysroot only,
# and a PIE executable unless HOLDFAST_PIE = "0".
check_flags() {
  local env=$1 label=$2 seccomp=$3 nonpie=$4
  local config depends confargs buildflags libpath rustflags
  config=$(value "$env" PACKAGECONFIG)
  depends=$(value "$env" DEPENDS)
  confargs=$(value "$env" PACKAGECONFIG_CONFARGS)
  buildflags=$(value "$env" CARGO_BUILD_FLAGS)
  libpath=$(value "$env" LIBSECCOMP_LIB_PATH)
  rustflags=$(value "$env" RUSTFLAGS)
  if ! echo " $buildflags " | grep -q ' --no-default-features '; then
    fail "$label: CARGO_BUILD_FLAGS keep Cargo's default features: $buildflags"
  elif [ "$seccomp" = yes ] && echo " $config " | grep -q ' seccomp ' &&
    echo " $depends " | grep -q ' libseccomp ' && echo "$confargs" | grep -q -- '--features seccomp' &&
    [ -n "$libpath" ]; then
    ok "$label: seccomp: PACKAGECONFIG \"$config\", --features seccomp, libseccomp from $libpath"
  elif [ "$seccomp" = no ] && ! echo " $config " | grep -q ' seccomp ' &&
    ! echo " $depends " | grep -q ' libseccomp ' && ! echo "$confargs" | grep -q seccomp; then
    ok "$label: no seccomp in DISTRO_FEATURES: no seccomp feature, no libseccomp"
  else
    fail "$label: seccomp $seccomp, but PACKAGECONFIG \"$config\", DEPENDS \"$depends\", PACKAGECONFIG_CONFARGS \"$confargs\", LIBSECCOMP_LIB_PATH \"$libpath\""
  fi
  if [ "$nonpie" = yes ] && echo "$rustflags" | grep -q 'relocation-model=static'; then
    ok "$label: HOLDFAST_PIE = 0: non-PIE"
  elif [ "$nonpie" = no ] && ! echo "$rustflags" | grep -q 'relocation-model'; then
    ok "$label: PIE, as the distro builds executables"
  else
    fail "$label: non-PIE $nonpie, but RUSTFLAGS \"$rustflags\""
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

# patched <build dir> <recipe PV> <task> <yes|no>: whether the task's log shows both
# 32-bit crate patches applied (yes) or none (no).
patched() {
  local dir=$1 pv=$2 task=$3 want=$4 log applied crate
  log=$(find "$work/$dir/tmp/work" -path "*/holdfast/$pv/temp/log.do_$task" | head -n 1)
  if [ -z "$log" ]; then
    fail "$dir: no log.do_$task of holdfast $pv"
    return
  fi
  applied=$(grep -c 'holdfast_patch_crates\|: applying .*-32bit.patch' "$log" || true)
  if [ "$want" = no ]; then
    if grep -q ': applying .*-32bit.patch' "$log"; then
      fail "$dir: holdfast $pv's do_$task applied a 32-bit patch: $(grep applying "$log")"
    else
      ok "$dir: holdfast $pv's do_$task applied no 32-bit patch"
    fi
    return
  fi
  for crate in libcontainer-0.7.0 libcgroups-0.7.0; do
    if grep -q "$crate: applying .*/cross/patches/$crate-32bit.patch" "$log"; then
      ok "$dir: holdfast $pv's do_$task applied $crate-32bit.patch"
    else
      fail "$dir: holdfast $pv's do_$task did not apply $crate-32bit.patch (log: $log, $applied lines of it)"
    fi
  done
}

step "build-arm64 (MACHINE qemuarm64): bitbake -p"
new_build build-arm64 qemuarm64 'DISTRO_FEATURES:append = " holdfast"' "$layer"
run parse.log in_build build-arm64 bitbake -p && grep -h '^Parsing of' parse.log || true

step "build-arm64: bitbake -e holdfast (release), -e -b holdfast_git.bb, -e -b holdfast-image.bb"
if run env-release-arm64.log in_build build-arm64 bitbake -e holdfast; then
  pv=$(value env-release-arm64.log PV)
  [ "$pv" = "$(basename "$release_bb" .bb | cut -d_ -f2)" ] && ok "bitbake -e holdfast: PV $pv (the release)" ||
    fail "bitbake -e holdfast gives PV $pv, not the release's"
  check_env env-release-arm64.log "qemuarm64 release" "$recipes/holdfast-$pv-crates.inc" arm64-vm no yes
  check_flags env-release-arm64.log "qemuarm64 release" yes no
fi
if run env-git-arm64.log in_build build-arm64 bitbake -e -b "$git_bb"; then
  check_env env-git-arm64.log "qemuarm64 git" "$recipes/holdfast-crates.inc" arm64-vm no no
  check_flags env-git-arm64.log "qemuarm64 git" yes no
  [ "$(value env-git-arm64.log EXTERNALSRC)" = "$work/src" ] && ok "qemuarm64 git: EXTERNALSRC = $work/src" ||
    fail "qemuarm64 git: EXTERNALSRC is \"$(value env-git-arm64.log EXTERNALSRC)\", not the checkout $work/src"
fi
# With DISTRO_FEATURES "holdfast" (build-arm64 has it), linux-yocto takes the fragment.
if run env-kernel-arm64.log in_build build-arm64 bitbake -e virtual/kernel; then
  if value env-kernel-arm64.log SRC_URI | grep -q 'file://holdfast.cfg'; then
    ok "linux-yocto: SRC_URI has holdfast.cfg"
  else
    fail "linux-yocto: DISTRO_FEATURES has holdfast, but SRC_URI has no holdfast.cfg"
  fi
fi
if run env-board-arm64.log in_build build-arm64 bitbake -e -b "$board_bb"; then
  check_board env-board-arm64.log qemuarm64 arm64-vm
fi
if run env-image.log in_build build-arm64 bitbake -e -b "$image_bb"; then
  if echo " $(value env-image.log IMAGE_INSTALL) " | grep -q ' packagegroup-holdfast '; then
    ok "holdfast-image: IMAGE_INSTALL has packagegroup-holdfast"
  else
    fail "holdfast-image: IMAGE_INSTALL is \"$(value env-image.log IMAGE_INSTALL)\""
  fi
  # Room for a real pod's image and RAM for runqemu.
  extra=$(value env-image.log IMAGE_ROOTFS_EXTRA_SPACE)
  qb_mem=$(value env-image.log QB_MEM)
  if [ "${extra:-0}" -ge 1048576 ] 2>/dev/null && [ "$qb_mem" = "-m 1024" ]; then
    ok "holdfast-image: IMAGE_ROOTFS_EXTRA_SPACE = $extra KiB, QB_MEM = $qb_mem"
  else
    fail "holdfast-image: IMAGE_ROOTFS_EXTRA_SPACE is \"$extra\", QB_MEM \"$qb_mem\""
  fi
fi

step "build-arm64: bitbake -g holdfast packagegroup-holdfast holdfast-image"
run graph.log in_build build-arm64 bitbake -g holdfast packagegroup-holdfast holdfast-image || true

step "build-arm64: bitbake holdfast -c patch"
if run patch-arm64.log in_build build-arm64 bitbake holdfast -c patch; then
  patched build-arm64 "$pv" patch no
  # The fetcher writes the checksums it verified into each crate's .done stamp.
  unverified=$(find downloads -name '*.crate.done' -empty | wc -l)
  if [ "$unverified" = 0 ]; then
    ok "every crate's sha256 checked against the .inc ($(find downloads -name '*.crate.done' | wc -l) .done stamps with checksums)"
  else
    fail "$unverified crates' .done stamps are still empty: their checksums were not verified"
  fi
fi

step "build-arm64: yocto-check-layer's tests that need no world build"
if in_build build-arm64 python3 "$work/src/yocto/check-layer-subset.py" "$work/oe-core" "$work/bitbake" "$layer" >check-layer.log 2>&1; then
  ok "yocto-check-layer (subset)"
else
  fail "yocto-check-layer (subset; its output below)"
  tail -n 40 check-layer.log >&2
fi
grep -E ' \.\.\. |^Ran |^OK|^FAILED' check-layer.log || true
stop_servers

# Only meta-holdfast's and the stand-in's recipes are parsed here (oe-core's are
# masked): what `bitbake -e` says of a recipe depends on the configuration, the classes
# and the recipe's own files, not on other recipes (build-arm64 resolved those), and
# `-b` runs a recipe's tasks without resolving its dependencies. `bitbake -e -b` would
# leave out the dynamic layer's bbappend: recipe-env.py reads the recipes through
# tinfoil, bbappends applied. (The layer's linux-yocto bbappend is masked too: it
# would append to nothing.)
step "build-arm (MACHINE qemuarm, with virtualization-layer, oe-core's recipes masked): both recipes' variables"
# A distro without seccomp, and a product that takes the non-PIE executable.
new_build build-arm qemuarm "BBMASK += \"$work/oe-core/meta/recipes- $layer/recipes-kernel/\"
DISTRO_FEATURES:remove = \"seccomp\"
HOLDFAST_PIE = \"0\"
HOLDFAST_DATA_DEVICE = \"/dev/disk/by-label/holdfast-data\"" \
  "$work/fake-virt" "$layer"
env_vars=(LICENSE SRC_URI RRECOMMENDS:holdfast HOLDFAST_BOARD PACKAGE_ARCH MACHINE_ARCH PV EXTERNALSRC
  PACKAGECONFIG DEPENDS PACKAGECONFIG_CONFARGS CARGO_BUILD_FLAGS LIBSECCOMP_LIB_PATH RUSTFLAGS
  SYSTEMD_SERVICE:holdfast)
if run env-release-arm.log in_build build-arm python3 "$work/src/yocto/recipe-env.py" "$work/bitbake" "$release_bb" "${env_vars[@]}"; then
  check_env env-release-arm.log "qemuarm release" "$recipes/holdfast-$pv-crates.inc" "" yes yes
  check_flags env-release-arm.log "qemuarm release" no yes
fi
if run env-git-arm.log in_build build-arm python3 "$work/src/yocto/recipe-env.py" "$work/bitbake" "$git_bb" "${env_vars[@]}"; then
  check_env env-git-arm.log "qemuarm git" "$recipes/holdfast-crates.inc" "" yes no
  check_flags env-git-arm.log "qemuarm git" no yes
  if run env-board-arm.log in_build build-arm python3 "$work/src/yocto/recipe-env.py" "$work/bitbake" "$board_bb" HOLDFAST_BOARD PACKAGE_ARCH MACHINE_ARCH; then
    check_board env-board-arm.log qemuarm ""
  fi
  units=$(value env-git-arm.log SYSTEMD_SERVICE:holdfast)
  if echo " $units " | grep -q ' var-lib-holdfast.mount '; then
    ok "qemuarm git: HOLDFAST_DATA_DEVICE set: SYSTEMD_SERVICE:holdfast = $units"
  else
    fail "qemuarm git: HOLDFAST_DATA_DEVICE set, but SYSTEMD_SERVICE:holdfast is \"$units\""
  fi
fi

step "build-arm: bitbake -b holdfast_$pv.bb -c patch, bitbake -b holdfast_git.bb -c unpack"
run patch-arm.log in_build build-arm bitbake -b "$release_bb" -c patch && patched build-arm "$pv" patch yes
git_pv=$(value env-git-arm.log PV)
run unpack-git-arm.log in_build build-arm bitbake -b "$git_bb" -c unpack && patched build-arm "$git_pv" unpack yes
stop_servers

if [ -n "${HOLDFAST_CHECK_LAYER_FULL:-}" ]; then
  step "yocto-check-layer meta-holdfast, whole (oe-core alone, MACHINE qemuarm64)"
  new_build build-check qemuarm64 ""
  if in_build build-check yocto-check-layer --no-auto --no-auto-dependency "$layer" >check-layer-full.log 2>&1; then
    ok "yocto-check-layer"
  else
    fail "yocto-check-layer (its output below)"
  fi
  grep -E 'INFO: (test_|Ran |OK|FAILED)|\.\.\. (ok|FAIL|ERROR|skipped|PASS)' check-layer-full.log || tail -n 40 check-layer-full.log
  stop_servers
fi

step ""
echo "== times"
printf '%s' "$timings"
echo "== $failures failure(s)"
[ "$failures" = 0 ]
