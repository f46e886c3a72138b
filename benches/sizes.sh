#!/usr/bin/env bash
# Binary sizes and their budget, run on demand (not part of CI's tests):
#
#   bash benches/sizes.sh                                       # x86_64, aarch64, armv7
#   SIZES_TARGETS=aarch64-unknown-linux-gnu bash benches/sizes.sh   # the device budget only
#
# Builds release as .ci/cross does (all targets with the crates of cross/patch-crates.sh;
# x86_64 with .cargo/x86_64-release.toml, whose flags .cargo/config.toml cannot give it),
# prints each stripped binary's size and largest sections, and splits aarch64's code and
# data into subsystems with a budget each. Needs no network once the crates are fetched
# and no cargo-bloat: the split comes from `nm` on a `bloat` build, the release profile
# without the strip and with Rust's v0 symbol names, which keep generic arguments (so
# `Vec<Pod>` code counts as k8s, not std). Each symbol counts for the first crate its
# name mentions that is not std; code a crate inlines into another counts there.
# Writes target/bench/sizes.json. Exits 1 when aarch64's stripped binary is over its
# budget; a subsystem over its own budget is a warning.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${CARGO_TARGET_DIR:-target}"
bench="target/bench"
mkdir -p "$bench"
read -r -a targets <<<"${SIZES_TARGETS:-x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf}"
device=aarch64-unknown-linux-gnu
[[ " ${targets[*]} " == *" $device "* ]] || targets+=("$device")
# The device budget: the aarch64 stripped binary, default features (7.01 MiB measured
# with v0.1's crates; see the size budget in docs/footprint.md).
budget=$((8192 * 1024))

cargo fetch --quiet

# One cargo run per profile builds all targets, so their single-threaded LTO links
# overlap.
tflags=(--bin holdfast)
for t in "${targets[@]}"; do tflags+=(--target "$t"); done
bash cross/release-build.sh build --quiet --release "${tflags[@]}"
CARGO_PROFILE_BLOAT_INHERITS=release CARGO_PROFILE_BLOAT_STRIP=false \
  bash cross/release-build.sh --config "target.$device.rustflags=[\"-C\",\"symbol-mangling-version=v0\"]" \
  build --quiet --profile bloat --bin holdfast --target "$device"

# The crates in the build, for telling a crate from a module in a symbol's path.
cargo metadata --quiet --offline --format-version 1 --filter-platform "$device" |
  jq -r '.packages[].targets[] | select(any(.kind[]; test("lib"))) | .name' |
  tr - _ | sort -u >"$bench/crates.txt"

for t in "${targets[@]}"; do
  size -A "$out/$t/release/holdfast" | awk -v t="$t" 'NF == 3 && $2 ~ /^[0-9]+$/ {print t "\t" $1 "\t" $2}'
done >"$bench/sections.tsv"
nm -S --size-sort -C "$out/$device/bloat/holdfast" >"$bench/symbols.txt"

python3 - "$bench" "$budget" "$out" "${targets[@]}" <<'EOF'
import collections, json, os, re, sys

bench, budget, out, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
device = "aarch64-unknown-linux-gnu"
MiB = 1024 * 1024

# subsystem: (crates, budget in bytes of aarch64 symbols). A crate not listed is "rest".
SUBSYSTEMS = [
    ("std, core, alloc", "std core alloc compiler_builtins std_detect hashbrown gimli addr2line"
        " object rustc_demangle miniz_oxide adler2 panic_abort unwind", 0.50),
    ("k8s model + serde", "k8s_openapi serde serde_core serde_json serde_yaml unsafe_libyaml"
        " zmij ryu itoa indexmap", 1.25),
    ("container runtime", "libcontainer libcgroups oci_spec regex regex_automata regex_syntax"
        " aho_corasick nix procfs procfs_core pathrs libseccomp libseccomp_sys caps prctl"
        " chrono netlink_packet_route netlink_packet_core netlink_packet_utils netlink_sys"
        " rustix linux_raw_sys protobuf rust_criu safe_path fastrand getset", 1.15),
    ("TLS + crypto", "rustls rustls_webpki webpki ring rcgen yasna time time_core pem sha2 sha1"
        " digest block_buffer generic_array crypto_common cpufeatures rustls_pki_types"
        " rustls_native_certs untrusted subtle zeroize tokio_rustls getrandom", 0.38),
    ("HTTP + async", "tokio mio hyper hyper_util http http_body httparse httpdate ureq ureq_proto"
        " bytes socket2 futures_core futures_util futures_channel futures_task pin_project_lite"
        " percent_encoding utf8_zero want atomic_waker", 0.37),
    ("store", "sled crossbeam_epoch crossbeam_utils crossbeam_channel parking_lot"
        " parking_lot_core lock_api fxhash fs2 instant", 0.31),
    ("images", "tar flate2 zlib_rs ruzstd xattr filetime twox_hash crc32fast", 0.11),
    ("holdfast", "holdfast", 1.25),
    ("rest: logging, time, misc", "", 0.11),
    # opt-level "z" lets LLVM's machine outliner move repeated instruction sequences of
    # all crates into shared OUTLINED_FUNCTION_n.
    ("outlined sequences (all crates)", "", 0.36),
    ("C and asm (libseccomp, ring)", "", 0.43),
]
# String literals and other anonymous .rodata, .data, headers. The unwind tables
# (.eh_frame, .eh_frame_hdr: 1.3 MiB) are not linked into release binaries (build.rs).
OVERHEAD_BUDGET = 1.30

crates = set(open(os.path.join(bench, "crates.txt")).read().split())
crates |= {"std", "core", "alloc", "compiler_builtins", "std_detect", "panic_abort", "unwind"}
owner = {}
for name, members, _ in SUBSYSTEMS:
    for c in members.split():
        owner[c] = name
STD = set(SUBSYSTEMS[0][1].split()) - {"hashbrown"}
path = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)::")

by_sub = collections.Counter()
by_crate = collections.Counter()
by_module = collections.Counter()
sub_of = {}
for line in open(os.path.join(bench, "symbols.txt")):
    parts = line.rstrip("\n").split(" ", 3)
    # Only what the stripped file keeps: code, read-only data, initialised data.
    if len(parts) < 4 or parts[2] not in "tTwWrRdDvV":
        continue
    size, name = int(parts[1], 16), parts[3]
    named = [c for c in path.findall(name) if c in crates]
    crate = next((c for c in named if c not in STD), named[0] if named else None)
    if crate is None and name.startswith("OUTLINED_FUNCTION"):
        sub = crate = "outlined sequences (all crates)"
    elif crate is None:
        sub = "C and asm (libseccomp, ring)"
        crate = "ring (asm, C)" if name.startswith("ring_core") else "C"
    else:
        sub = owner.get(crate, "rest: logging, time, misc")
    sub_of[crate] = sub
    by_sub[sub] += size
    by_crate[crate] += size
    if crate == "holdfast":
        m = re.search(r"holdfast::([a-z_0-9]+)", name)
        by_module[m.group(1) if m else "?"] += size

sections = collections.defaultdict(dict)
for line in open(os.path.join(bench, "sections.tsv")):
    t, sec, n = line.split("\t")
    sections[t][sec] = int(n)
stripped = {t: os.stat(os.path.join(out, t, "release", "holdfast")).st_size for t in targets}

def mib(n):
    return f"{n / MiB:6.2f} MiB"

print(f"{'target':32} {'stripped':>22}  largest sections")
for t in targets:
    top = sorted(sections[t].items(), key=lambda kv: -kv[1])[:5]
    print(f"{t:32} {stripped[t]:>10} B {mib(stripped[t])}  "
          + ", ".join(f"{s} {n / MiB:.2f}" for s, n in top))

rows = []
warn = []
attributed = sum(by_sub.values())
for name, members, b in SUBSYSTEMS:
    got = by_sub.get(name, 0)
    top = [c for c, _ in by_crate.most_common() if sub_of[c] == name][:4]
    rows.append({"subsystem": name, "largest_crates": top, "bytes": got, "budget_bytes": int(b * MiB)})
    if got > b * MiB:
        warn.append(name)
overhead = stripped[device] - attributed
rows.append({"subsystem": "anonymous data, headers", "largest_crates": [],
             "bytes": overhead, "budget_bytes": int(OVERHEAD_BUDGET * MiB)})
if overhead > OVERHEAD_BUDGET * MiB:
    warn.append("overhead")

print(f"\n{device}, by subsystem (code and data symbols of the bloat build):")
print(f"| {'subsystem':38} | {'largest crates':52} | {'bytes':>10} | {'budget':>10} |")
print(f"|{'-' * 40}|{'-' * 54}|{'-' * 11}:|{'-' * 11}:|")
for r in rows:
    print(f"| {r['subsystem']:38} | {', '.join(r['largest_crates']):52} | {mib(r['bytes']):>10} |"
          f" {mib(r['budget_bytes']):>10} |")
print(f"| {'total (stripped file)':38} | {'':52} | {mib(stripped[device]):>10} | {mib(budget):>10} |")
print("\nholdfast by module: " + ", ".join(
    f"{m} {n / 1024:.0f} KiB" for m, n in by_module.most_common()))

report = {
    "targets": {t: {"stripped_bytes": stripped[t], "sections": sections[t]} for t in targets},
    "aarch64_budget_bytes": budget,
    "aarch64_subsystems": rows,
    "aarch64_crates": dict(by_crate.most_common()),
    "aarch64_holdfast_modules": dict(by_module.most_common()),
}
with open(os.path.join(bench, "sizes.json"), "w") as f:
    json.dump(report, f, indent=1)
print(f"\nwrote {bench}/sizes.json")
for w in warn:
    print(f"warning: {w} is over its budget")
if stripped[device] > budget:
    print(f"{device}: {stripped[device]} bytes, OVER the {budget} byte budget")
    sys.exit(1)
print(f"{device}: {stripped[device]} bytes, within the {budget} byte budget")
EOF
