#!/usr/bin/env bash
# Runs cargo for the device builds as .ci/cross and benches/sizes.sh make them:
#
#   cross/release-build.sh build --release --bin holdfast --target aarch64-unknown-linux-gnu ...
#
# with the crates of cross/patch-crates.sh (armv7 needs them; on 64-bit targets they are
# the same code) and .cargo/x86_64-release.toml (the device targets' codegen flags for an
# x86_64 release build, which .cargo/config.toml cannot give it). The [patch] makes cargo
# record the patched crates as path crates in Cargo.lock, so cargo runs in a copy of the
# source tree (target/release-tree, refreshed each time with the files' times kept, so
# unchanged sources are not rebuilt): the tree's own Cargo.lock is never touched, and
# tests that read it may run meanwhile. Outputs go to the usual target dir
# (CARGO_TARGET_DIR or target/). Expects `cargo fetch` to have run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"

bash cross/patch-crates.sh >/dev/null
tree="$root/target/release-tree"
rm -rf "$tree.new"
mkdir -p "$tree.new"
tar -C "$root" --exclude=./target --exclude=./.git -cf - . | tar -C "$tree.new" -xf -
rm -rf "$tree"
mv "$tree.new" "$tree"
cd "$tree"
CARGO_TARGET_DIR="$out" exec cargo --config "$root/target/patched/config.toml" \
  --config .cargo/x86_64-release.toml "$@"
