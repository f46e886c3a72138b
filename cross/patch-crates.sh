#!/usr/bin/env bash
# Copies the crates named by cross/patches/<crate>-<version>-<what>.patch from cargo's
# registry source dir into target/patched/<crate>-<version>/, applies their patches, and
# writes target/patched/config.toml with [patch.crates-io] entries for them:
#
#   cargo fetch
#   cross/patch-crates.sh
#   cargo --config target/patched/config.toml build --release --target armv7-unknown-linux-gnueabihf
#
# Every run starts again from the pristine crate source, so it is idempotent; a patch that
# does not apply, or a crate version that is not in Cargo.lock, stops it with an error.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/target/patched"
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"

die() { echo "patch-crates: $*" >&2; exit 1; }
command -v patch >/dev/null || die "needs patch(1) (apt-get install patch)"

declare -A crates=()   # "<crate>-<version>" -> patch files, in name order
shopt -s nullglob
for p in cross/patches/*.patch; do
  name="$(basename "$p" .patch)"
  [[ "$name" =~ ^(.+)-([0-9]+\.[0-9]+\.[0-9]+)-.+$ ]] ||
    die "$p: name is not <crate>-<version>-<what>.patch"
  key="${BASH_REMATCH[1]}-${BASH_REMATCH[2]}"
  crates[$key]+="$root/$p "
done
[ ${#crates[@]} -gt 0 ] || die "no patches under cross/patches"

mkdir -p "$out"
rm -f "$out/config.toml"   # a failed run leaves no config to build with
config="$out/config.toml.tmp"
{
  echo "# Written by cross/patch-crates.sh: crates from crates.io with cross/patches applied."
  echo "[patch.crates-io]"
} >"$config"

for key in $(printf '%s\n' "${!crates[@]}" | sort); do
  crate="${key%-*}"; version="${key##*-}"
  grep -qzP "name = \"\Q$crate\E\"\nversion = \"\Q$version\E\"\n" Cargo.lock ||
    die "$crate $version is not in Cargo.lock: update cross/patches for the new version"
  src=""
  for d in "$registry"/*/"$key"; do [ -f "$d/Cargo.toml" ] && { src="$d"; break; }; done
  [ -n "$src" ] || die "$key not in $registry (run cargo fetch first)"

  dest="$out/$key"
  rm -rf "$dest" "$dest.tmp"
  cp -a "$src" "$dest.tmp"
  for p in ${crates[$key]}; do
    patch -d "$dest.tmp" -p1 --batch --forward --no-backup-if-mismatch --quiet <"$p" ||
      die "$(basename "$p") does not apply to $crate $version"
  done
  mv "$dest.tmp" "$dest"
  # Cargo resolves paths in a --config file against the parent of the file's folder
  # (target/), so the file holds in any mount of the project, such as cross's container.
  echo "$crate = { path = \"patched/$key\" }" >>"$config"
done
mv "$config" "$out/config.toml"
echo "patch-crates: $(printf '%s ' "${!crates[@]}")-> $out/config.toml"
