#!/usr/bin/env bash
# Binary sizes, run on demand: `bash benches/sizes.sh`.
#
# Builds release for x86_64, aarch64 and armv7 as .ci/cross does (all three with the crates
# of cross/patch-crates.sh, so its binaries are reused), prints
# each stripped binary's size and its 15 largest crates (cargo bloat --crates), and
# writes target/bench/sizes.json. cargo bloat needs symbols, so it measures a `bloat`
# profile: release without the strip. Device budget: aarch64 <= 8 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-bloat >/dev/null || cargo install cargo-bloat --locked --quiet

out="${CARGO_TARGET_DIR:-target}"
bench="target/bench"
mkdir -p "$bench"
targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf)
budget=$((8 * 1024 * 1024))

cargo fetch --quiet
cp Cargo.lock "$bench/Cargo.lock.sizes"
trap 'cp "$bench/Cargo.lock.sizes" Cargo.lock' EXIT   # the [patch] rewrites it
bash cross/patch-crates.sh >/dev/null

# One cargo run per profile builds all three targets, so their single-threaded LTO links
# overlap; cargo bloat then finds its build done.
tflags=(); for t in "${targets[@]}"; do tflags+=(--target "$t"); done
export CARGO_PROFILE_BLOAT_INHERITS=release CARGO_PROFILE_BLOAT_STRIP=false
patched=(--config target/patched/config.toml)
cargo "${patched[@]}" build --quiet --release --bin holdfast "${tflags[@]}"
cargo "${patched[@]}" build --quiet --profile bloat --bin holdfast "${tflags[@]}"
cp "$bench/Cargo.lock.sizes" Cargo.lock

json="{"
sep=""
for t in "${targets[@]}"; do
  size=$(stat -c %s "$out/$t/release/holdfast")
  echo "== $t: $size bytes stripped ($(numfmt --to=iec-i --suffix=B "$size")); largest crates, unstripped:"
  cargo bloat "${patched[@]}" --profile bloat --target "$t" --bin holdfast --crates -n 15 \
    --message-format json >"$bench/bloat-$t.json"
  cp "$bench/Cargo.lock.sizes" Cargo.lock
  jq -r '.crates[] | "  \(.size)\t\(.name)"' "$bench/bloat-$t.json"
  json+="$sep\"$t\":{\"stripped_bytes\":$size,\"unstripped\":$(cat "$bench/bloat-$t.json")}"
  sep=","
done
json+=",\"aarch64_budget_bytes\":$budget}"
jq . <<<"$json" >"$bench/sizes.json"
rm -f "$bench"/bloat-*.json
a64=$(jq '."aarch64-unknown-linux-gnu".stripped_bytes' "$bench/sizes.json")
if [ "$a64" -le "$budget" ]; then echo "aarch64 within the 8 MiB budget"; else echo "aarch64 OVER the 8 MiB budget"; fi
echo "wrote $bench/sizes.json"
