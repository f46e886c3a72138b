#!/usr/bin/env python3
"""Writes the linker script that places the functions the idle agent runs together
(cross/hot-text.ld), from an x86_64 release binary with symbols and the pages of its
code that were mapped while the agent idled (benches/footprint.rs, FOOTPRINT_CODE_PAGES).

    python3 cross/hot-text.py BINARY PAGES... > cross/hot-text.ld
    python3 cross/hot-text.py --check BINARY [SCRIPT]

With --check it says how many of holdfast's own functions that the script names no longer
exist in BINARY (any build with symbols: the debug binary will do), and exits 1 when more
than a fifth of them are gone: the code has moved since the list was measured, and
cross/hot-text.sh should measure it again.

Every function that overlaps a mapped page is taken, by its name with what changes from
build to build left out, so that the script matches the same functions in a build of
another commit, another target (aarch64, armv7) or another Rust (the Yocto release's):
the hash at the end of a legacy Rust name (17h<16 hex>E) and the crate hashes inside a
v0 name (Cs<base62>_). A function renamed or added since falls back to the ordinary
.text: a stale script only costs memory."""

import fnmatch
import re
import subprocess
import sys


# The share of holdfast's own functions in the script that may be gone before --check fails.
STALE_LIMIT = 0.2


def symbols(binary):
    nm = subprocess.run(
        ["nm", "--defined-only", binary], capture_output=True, text=True, check=True,
    ).stdout
    return [f[2] for f in (line.split() for line in nm.splitlines()) if len(f) == 3]


def check(binary, script="cross/hot-text.ld"):
    with open(script) as f:
        patterns = [line.strip()[len("*(.text."):-1] for line in f
                    if line.strip().startswith("*(.text.")]
    own = [p for p in patterns if "8holdfast" in p]
    names = [n for n in symbols(binary) if "8holdfast" in n]
    gone = [p for p in own if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    print(f"hot-text: {len(gone)} of the {len(own)} holdfast functions {script} places "
          f"are not in {binary}")
    for p in gone:
        print(f"  gone: {p}")
    if not own or len(gone) > STALE_LIMIT * len(own):
        print("hot-text: the list is stale: measure it again (as root: bash cross/hot-text.sh)")
        sys.exit(1)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--check":
        return check(*sys.argv[2:4])
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary, page_files = sys.argv[1], sys.argv[2:]
    pages = set()
    for name in page_files:
        with open(name) as f:
            pages.update(int(line, 16) for line in f if line.strip())
    nm = subprocess.run(
        ["nm", "--defined-only", "--print-size", binary],
        capture_output=True, text=True, check=True,
    ).stdout
    legacy_hash = re.compile(r"17h[0-9a-f]{16}E$")
    crate_hash = re.compile(r"Cs[0-9A-Za-z]{1,16}_")
    patterns, hot_bytes = set(), 0
    for line in nm.splitlines():
        fields = line.split()
        if len(fields) != 4 or fields[2] not in "tTW":
            continue
        addr, size, name = int(fields[0], 16), int(fields[1], 16), fields[3]
        first, last = addr >> 12, (addr + max(size, 1) - 1) >> 12
        if not any((p << 12) in pages for p in range(first, last + 1)):
            continue
        hot_bytes += size
        if legacy_hash.search(name):
            name = legacy_hash.sub("", name) + "*"
        elif name.startswith("_R"):
            name = crate_hash.sub("Cs*_", name)
        # Names that a linker script cannot hold unquoted stay in .text.
        if re.fullmatch(r"[A-Za-z0-9_.$*]+", name):
            patterns.add(name)
    if not patterns:
        sys.exit("hot-text: no function of the binary lies in those pages")
    print(f"hot-text: {len(pages)} pages, {hot_bytes} bytes of functions, "
          f"{len(patterns)} patterns", file=sys.stderr)
    print("/* Written by cross/hot-text.sh: the functions the idle agent ran, placed together")
    print("   before the rest of the code (INSERT), so that the kernel's fault-around maps")
    print("   little beside them. build.rs links release binaries with it. */")
    print("SECTIONS {\n  .text.hot : {")
    for p in sorted(patterns):
        print(f"    *(.text.{p})")
    print("  }\n} INSERT BEFORE .text;")


main()
