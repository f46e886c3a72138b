#!/usr/bin/env bash
# Writes cross/hot-text.ld again (as root, on x86_64): which functions the idle agent runs,
# measured on this commit, for build.rs to place them together in release binaries.
#
# Why: the kernel maps up to 64 KiB of a program's file around each page of code it
# faults in, when those pages are in the page cache (fault-around). The idle agent's
# timers ran code spread over the whole .text, so fault-around mapped most of it again
# after each trim: 4-5 MiB of the agent's PSS with its binary cached. With the functions
# that run while idle placed together, it maps those and little else.
#
# How: an x86_64 release binary with symbols (target/hot-text) is copied to an ext4
# loop file system with readahead off and runs the footprint bench's burst part
# (FOOTPRINT_CODE_PAGES): with nothing of the binary in the page cache, neither
# readahead nor fault-around maps anything beside the pages the agent runs, so the pages
# mapped while idle (fresh, and after a burst) are the ones it needs. cross/hot-text.py
# turns them into the script. Takes about 10 minutes (the build) plus 3.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "hot-text: needs root (a loop mount, /proc/<pid>/pagemap)" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "hot-text: reads 4 KiB pages of an x86_64 build" >&2; exit 1; }

out=target/hot-text
mkdir -p "$out"
CARGO_PROFILE_RELEASE_STRIP=none CARGO_TARGET_DIR="$PWD/$out" bash cross/release-build.sh \
  build --quiet --release --bin holdfast --target x86_64-unknown-linux-gnu
bin="$out/x86_64-unknown-linux-gnu/release/holdfast"

mnt="$out/mnt" img="$out/fs.img" pages="$out/pages" dev=""
cleanup() {
  mountpoint -q "$mnt" && umount "$mnt"
  [ -z "$dev" ] || losetup -d "$dev" 2>/dev/null || true
  rm -f "$img"
}
trap cleanup EXIT
mkdir -p "$mnt"
rm -rf "$pages" && mkdir -p "$pages"
truncate -s 64M "$img"
mkfs.ext4 -q -F "$img"
dev=$(losetup --find --show "$img")
echo 0 >"/sys/block/$(basename "$dev")/queue/read_ahead_kb"
mount -o nosuid,nodev "$dev" "$mnt"
cp "$bin" "$mnt/holdfast"
# Mounted again: nothing of the copy stays in the page cache.
umount "$mnt" && mount -o nosuid,nodev "$dev" "$mnt"

HOLDFAST_BIN="$PWD/$mnt/holdfast" FOOTPRINT_CODE_PAGES="$PWD/$pages" FOOTPRINT_SETTLE_SECS=60 \
  FOOTPRINT_SKIP=sizes,running,start,writes cargo bench --quiet --bench footprint

python3 cross/hot-text.py "$bin" "$pages"/*.pages >cross/hot-text.ld
echo "hot-text: cross/hot-text.ld written; rebuild the release binaries to use it"
