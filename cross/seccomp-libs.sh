#!/usr/bin/env bash
# Prints the environment that links libcontainer's seccomp support (the `seccomp` feature)
# against libseccomp for one target:
#
#   eval "$(cross/seccomp-libs.sh aarch64-unknown-linux-gnu)"
#   cargo build --release --features seccomp --target aarch64-unknown-linux-gnu
#
# x86_64: Debian's libseccomp-dev, linked dynamically (libseccomp2 is on every Debian).
# aarch64, armv7: the static libseccomp.a from Debian's libseccomp-dev:arm64/:armhf,
# fetched with apt-get download and unpacked under target/seccomp/<arch>/ (nothing is
# installed for the foreign architecture), so the device binary needs no libseccomp.
# Needs root the first time (dpkg --add-architecture, apt-get).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${1:?usage: seccomp-libs.sh TARGET}"

log() { echo "seccomp-libs: $*" >&2; }

case "$target" in
  x86_64-unknown-linux-gnu)
    if ! dpkg -s libseccomp-dev >/dev/null 2>&1; then
      log "installing libseccomp-dev"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev >/dev/null
    fi
    echo "unset LIBSECCOMP_LIB_PATH LIBSECCOMP_LINK_TYPE"
    exit 0 ;;
  aarch64-unknown-linux-gnu) arch=arm64; triplet=aarch64-linux-gnu ;;
  armv7-unknown-linux-gnueabihf) arch=armhf; triplet=arm-linux-gnueabihf ;;
  *) log "no libseccomp recipe for $target"; exit 1 ;;
esac

dir="$root/target/seccomp/$arch"
lib="$dir/usr/lib/$triplet"
if [ ! -f "$lib/libseccomp.a" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
    log "adding dpkg architecture $arch"
    dpkg --add-architecture "$arch"
  fi
  if ! apt-cache show "libseccomp-dev:$arch" >/dev/null 2>&1; then
    # A mirror mid-sync can fail one index; what it did fetch is enough if it has ours.
    apt-get update -qq >&2 || log "apt-get update reported errors (going on)"
  fi
  tmp="$(mktemp -d)"
  chown _apt "$tmp" 2>/dev/null || true   # apt downloads as _apt where it can
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download -qq "libseccomp-dev:$arch" >&2)
  rm -rf "$dir"
  mkdir -p "$dir"
  dpkg-deb -x "$tmp"/libseccomp-dev_*_"$arch".deb "$dir"
  [ -f "$lib/libseccomp.a" ] || { log "no libseccomp.a in libseccomp-dev:$arch"; exit 1; }
fi
echo "export LIBSECCOMP_LIB_PATH='$lib' LIBSECCOMP_LINK_TYPE=static"
