#!/usr/bin/env bash
# Fetches Debian packages of another architecture without touching the host's dpkg or
# apt configuration:
#
#   cross/apt-foreign.sh arm64 libseccomp-dev            # prints the paths of the .debs
#   cross/apt-foreign.sh -x DIR armhf libseccomp-dev     # and unpacks them into DIR
#   cross/apt-foreign.sh -d arm64 linux-image-arm64      # prints what PKG depends on
#                                                        # (a metapackage's real package)
#
# `dpkg --add-architecture` would make every later `apt-get update` of the host fetch
# that architecture's indexes too, and one index caught mid-sync on a mirror then fails
# the host's updates. Here apt runs with a private state, cache and source list under
# target/apt-foreign/<arch>/ (APT::Architecture=<arch>), the sources copied from the
# host's (sources.list and sources.list.d, one-line and deb822); nothing is installed.
# The indexes are fetched again after a day; the .debs stay cached. As root or not.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

unpack=""
depends=""
if [ "${1:-}" = "-d" ]; then
  depends=1
  shift
elif [ "${1:-}" = "-x" ]; then
  unpack="${2:?usage: apt-foreign.sh [-x DIR] ARCH PKG...}"
  shift 2
fi
arch="${1:?usage: apt-foreign.sh [-x DIR] ARCH PKG...}"
shift
[ $# -gt 0 ] || { echo "usage: apt-foreign.sh [-x DIR] ARCH PKG..." >&2; exit 2; }
[[ "$arch" =~ ^[a-z0-9]+$ ]] || { echo "apt-foreign: bad architecture $arch" >&2; exit 2; }

log() { echo "apt-foreign: $*" >&2; }

dir="${CARGO_TARGET_DIR:-$root/target}/apt-foreign/$arch"
mkdir -p "$dir/state/lists/partial" "$dir/cache/archives/partial" "$dir/sources.list.d" "$dir/debs"
exec 9>"$dir/lock"
flock 9   # one fetch per architecture at a time

# The host's sources, as they are now; an entry restricted to other architectures
# (`[arch=amd64]`, `Architectures: amd64`) is simply not used for this one.
rm -f "$dir/sources.list.d/"*
: >"$dir/sources.list"
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$dir/sources.list"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && cp "$f" "$dir/sources.list.d/"
done
: >>"$dir/status"

apt_opts=(
  -o "Dir::State=$dir/state" -o "Dir::State::status=$dir/status"
  -o "Dir::Cache=$dir/cache" -o "Dir::Etc::SourceList=$dir/sources.list"
  # apt's binary cache of the indexes, kept with them: without it (Debian's container
  # images turn it off) each of the few dozen queries below parses every index again,
  # a second and more of CPU each.
  -o "Dir::Cache::pkgcache=pkgcache.bin" -o "Dir::Cache::srcpkgcache=srcpkgcache.bin"
  -o "Dir::Etc::SourceParts=$dir/sources.list.d"
  -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
  -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)"
  -o "Acquire::Languages=none" -q
)

have_all() {
  local p
  for p in "$@"; do
    apt-cache "${apt_opts[@]}" show "$p:$arch" >/dev/null 2>&1 || return 1
  done
}

stamp="$dir/state/updated"
if [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ] || ! have_all "$@"; then
  log "apt-get update ($arch)"
  # A mirror mid-sync can fail one index; what was fetched is enough if it has ours.
  if apt-get "${apt_opts[@]}" update >&2; then
    touch "$stamp"
  else
    log "apt-get update reported errors (going on)"
  fi
fi
have_all "$@" || { log "not in the $arch indexes: $*"; exit 1; }

if [ -n "$depends" ]; then
  for p in "$@"; do
    apt-cache "${apt_opts[@]}" depends "$p:$arch" | sed -n 's/^ *Depends: *\([^: ]*\).*/\1/p'
  done
  exit 0
fi

debs=()
for p in "$@"; do
  version="$(apt-cache "${apt_opts[@]}" policy "$p:$arch" | sed -n 's/^ *Candidate: *//p')"
  # apt names the file with the version's epoch colon as %3a (busybox-static_1%3a1.35...).
  file="$dir/debs/${p}_${version/:/%3a}_${arch}.deb"
  if [ ! -f "$file" ]; then
    (cd "$dir/debs" && apt-get "${apt_opts[@]}" download "$p:$arch" >&2)
    [ -f "$file" ] || { log "apt-get download left no $file"; exit 1; }
  fi
  debs+=("$file")
done

if [ -n "$unpack" ]; then
  mkdir -p "$unpack"
  for d in "${debs[@]}"; do dpkg-deb -x "$d" "$unpack"; done
fi
printf '%s\n' "${debs[@]}"
