#!/usr/bin/env bash
# Packages for gateways without Yocto (Debian, Raspberry Pi OS, Ubuntu on ARM): for each
# release binary that .ci/cross built (target/<triple>/release/holdfast),
#
#   target/deb/holdfast_<version>_<arch>.deb          arm64, armhf, amd64
#   target/deb/holdfast-<version>-<triple>.tar.gz      the same files, for `tar -C / -xzf`
#
#   bash cross/package.sh [TRIPLE...]      (default: every triple that has a binary)
#
# The files are the Yocto layer's (one unit and one default config for both): the binary
# in /usr/bin, holdfast.service in /lib/systemd/system, /etc/holdfast/config.yaml (a
# conffile: an edited one survives an upgrade), the board profiles in
# /usr/share/holdfast/boards, /etc/kubernetes/manifests for static pods and
# /var/lib/holdfast (0700: the store caches Secrets). Built with dpkg-deb itself; the
# glibc the package depends on is the newest symbol version the binary asks for.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${CARGO_TARGET_DIR:-target}"
dist="${HOLDFAST_PACKAGE_DIR:-target/deb}"
layer=yocto/meta-holdfast/recipes-containers/holdfast/files
version=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { echo "package: no version in Cargo.toml" >&2; exit 1; }

if [ $# -gt 0 ]; then
  triples=("$@")
else
  triples=()
  for t in aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf x86_64-unknown-linux-gnu; do
    [ -x "$out/$t/release/holdfast" ] && triples+=("$t")
  done
  [ ${#triples[@]} -gt 0 ] || { echo "package: no release binary under $out/*/release (run .ci/cross)" >&2; exit 1; }
fi

# HOLDFAST_PACKAGE_FAST=1 (tests): light compression, the same files.
deb_z=(-Zxz) tar_z=(-z)
[ "${HOLDFAST_PACKAGE_FAST:-}" = 1 ] && deb_z=(-Zgzip -z1) tar_z=(-I "gzip -1")

mkdir -p "$dist"
for t in "${triples[@]}"; do
  case "$t" in
    aarch64-unknown-linux-gnu) arch=arm64; depends="" ;;
    armv7-unknown-linux-gnueabihf) arch=armhf; depends="" ;;
    # x86_64 links the host's libseccomp; the device builds carry it (build.rs).
    x86_64-unknown-linux-gnu) arch=amd64; depends=", libseccomp2 (>= 2.5)" ;;
    *) echo "package: no Debian architecture for $t" >&2; exit 1 ;;
  esac
  bin="$out/$t/release/holdfast"
  [ -x "$bin" ] || { echo "package: $bin missing (run .ci/cross)" >&2; exit 1; }
  glibc=$(readelf -V --wide "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
  [ -n "$glibc" ] || { echo "package: no glibc symbol version in $bin" >&2; exit 1; }

  stage="$dist/stage-$arch"
  rm -rf "$stage"
  install -D -m 0755 "$bin" "$stage/usr/bin/holdfast"
  install -D -m 0644 "$layer/holdfast.service" "$stage/lib/systemd/system/holdfast.service"
  install -D -m 0644 "$layer/config.yaml" "$stage/etc/holdfast/config.yaml"
  install -d -m 0755 "$stage/usr/share/holdfast/boards" "$stage/etc/kubernetes/manifests"
  install -m 0644 board/*.yaml "$stage/usr/share/holdfast/boards/"
  install -d -m 0700 "$stage/var/lib/holdfast"
  install -D -m 0644 LICENSE "$stage/usr/share/doc/holdfast/copyright"

  # The tarball: the same tree, owned by root.
  tarball="$dist/holdfast-$version-$t.tar.gz"
  tar -C "$stage" --owner=0 --group=0 --numeric-owner "${tar_z[@]}" -cf "$tarball" usr lib etc var

  mkdir -p "$stage/DEBIAN"
  size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
  cat >"$stage/DEBIAN/control" <<CONTROL
Package: holdfast
Version: $version
Architecture: $arch
Maintainer: holdfast developers <holdfast@users.noreply.github.com>
Installed-Size: $size
Depends: libc6 (>= $glibc)$depends
Recommends: containernetworking-plugins, iptables
Section: admin
Priority: optional
Homepage: https://github.com/holdfast-agent/holdfast
Description: Kubernetes node agent for small gateways whose uplink comes and goes
 holdfast does the kubelet's job in one binary: it runs pods on the device through
 youki's libcontainer, keeps what it needs in a local store so that the site keeps
 working offline and across power cuts, and reports to the kube-apiserver whenever
 the uplink is there. Static pods from /etc/kubernetes/manifests work without a
 cluster; /etc/holdfast/config.yaml names the kubeconfig to join one.
CONTROL
  echo /etc/holdfast/config.yaml >"$stage/DEBIAN/conffiles"
  # As debhelper's systemd snippets do: enable and start on install, reload on upgrade,
  # stop on removal; nothing when installed into another root (DPKG_ROOT) or without
  # systemd running. Stopping the agent leaves its pods running (KillMode=process):
  # `holdfast reset` removes them.
  cat >"$stage/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  if [ -z "$2" ]; then
    systemctl enable --now holdfast.service
  else
    systemctl try-restart holdfast.service
  fi
fi
SCRIPT
  cat >"$stage/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl disable --now holdfast.service || true
fi
SCRIPT
  cat >"$stage/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
SCRIPT
  chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"
  deb="$dist/holdfast_${version}_$arch.deb"
  dpkg-deb --root-owner-group "${deb_z[@]}" --build "$stage" "$deb" >/dev/null
  rm -rf "$stage"
  printf 'package: %-40s %9d bytes (libc6 >= %s)\n' "$deb" "$(stat -c %s "$deb")" "$glibc"
  printf 'package: %-40s %9d bytes\n' "$tarball" "$(stat -c %s "$tarball")"
done
