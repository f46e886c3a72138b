#!/usr/bin/env bash
# The system test on real kernels: boots Debian 12's kernel for ARCH in qemu-system (TCG,
# no KVM: this machine kind has a /dev/kvm, but a guest under it printed nothing to its
# console in 9 minutes) on a cgroup v2-only hierarchy and runs holdfast's scenarios in it.
#
#   tests/vm/run.sh aarch64|armv7|x86_64 [--shell|--fetch]
#
# (--shell: the same guest with a shell on the console instead of the scenarios;
# --fetch: only the guest's packages into the cache, which needs no binary: CI fetches
# them while the tests run.)
#
# - Kernel (the real package behind linux-image-arm64 / -armmp-lpae / -amd64), busybox,
#   libc, iptables and the CNI plugins are Debian packages of the guest's architecture,
#   fetched by cross/apt-foreign.sh (private apt state; cached under target/apt-foreign).
# - The guest boots an initramfs made here (tests/vm/init), switch_roots into a tmpfs and
#   runs tests/vm/guest.sh, with a fresh ext4 disk (a file) as holdfast's root dir.
# - holdfast is the release binary of .ci/cross (built here if missing); the image is a
#   busybox image of the guest's architecture built by examples/busybox_image.
# - Boot 1 runs scenarios 1-7, meanwhile the host runs 6 (kubelet API, forwarded to a port
#   on 127.0.0.1 only), and ends in a power cut; boot 2 on the same disk checks 8.
#
# Ends with `N passed, M failed`; exits 1 when anything failed. Needs root only for apt.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
arch="${1:?usage: tests/vm/run.sh aarch64|armv7|x86_64}"
case "$arch" in
  aarch64) deb=arm64; kmeta=linux-image-arm64; triple=aarch64-unknown-linux-gnu
           qemu=(qemu-system-aarch64 -M virt -cpu cortex-a72); console=ttyAMA0; goarch=arm64 ;;
  armv7)   deb=armhf; kmeta=linux-image-armmp-lpae; triple=armv7-unknown-linux-gnueabihf
           qemu=(qemu-system-arm -M virt,highmem=off -cpu cortex-a15); console=ttyAMA0; goarch=arm/v7 ;;
  x86_64)  deb=amd64; kmeta=linux-image-amd64; triple=x86_64-unknown-linux-gnu
           qemu=(qemu-system-x86_64 -M q35 -cpu max); console=ttyS0; goarch=amd64 ;;
  *) echo "vm: unknown ARCH $arch (aarch64, armv7, x86_64)" >&2; exit 2 ;;
esac
command -v "${qemu[0]}" >/dev/null || {
  echo "vm: ${qemu[0]} missing (apt-get install qemu-system-arm qemu-system-x86)" >&2; exit 2; }

target="${CARGO_TARGET_DIR:-$root/target}"
work="$target/vm/$arch"
mkdir -p "$work"
log() { echo "vm[$arch]: $*" >&2; }
started=$SECONDS

# --- holdfast and the image ----------------------------------------------------------
bin="$target/$triple/release/holdfast"
if [ "${2:-}" != --fetch ] && [ ! -x "$bin" ]; then
  log "building $bin"
  cargo fetch --quiet
  bash cross/release-build.sh build --quiet --release --bin holdfast --target "$triple"
fi
# (While CI's tests run, cargo's lock on the target dir is theirs: --fetch needs no build.)
[ "${2:-}" = --fetch ] || cargo build --quiet --example busybox_image

# --- guest packages ------------------------------------------------------------------
af() { bash cross/apt-foreign.sh "$@"; }
kernel_pkg="$(af -d "$deb" "$kmeta" | grep '^linux-image-' | head -n 1)"
[ -n "$kernel_pkg" ] || { log "no kernel package behind $kmeta"; exit 1; }
pkgs=("$kernel_pkg" busybox-static libc6 libgcc-s1 libseccomp2 containernetworking-plugins
      iptables libip4tc2 libip6tc2 libxtables12 libnftnl11 libmnl0 libnetfilter-conntrack3
      libnfnetlink0)
mapfile -t debs < <(af "$deb" "${pkgs[@]}")
[ ${#debs[@]} -eq ${#pkgs[@]} ] || { log "apt-foreign gave ${#debs[@]} of ${#pkgs[@]} packages"; exit 1; }
if [ "${2:-}" = --fetch ]; then
  log "${#debs[@]} packages cached in $((SECONDS - started)) s"
  exit 0
fi
unpacked="$work/pkgs"
rm -rf "$unpacked"; mkdir -p "$unpacked"
# the kernel modules the guest loads (guest.sh) and those netfilter may ask for
kmod_paths=(kernel/fs/overlayfs kernel/fs/ext4 kernel/fs/jbd2 kernel/fs/mbcache.ko
  kernel/lib/crc16.ko kernel/lib/libcrc32c.ko kernel/crypto/crc32c_generic.ko
  kernel/drivers/virtio kernel/drivers/block/virtio_blk.ko kernel/drivers/net/veth.ko
  kernel/drivers/net/virtio_net.ko kernel/drivers/net/net_failover.ko kernel/net/core
  kernel/net/bridge kernel/net/802 kernel/net/llc kernel/net/netfilter kernel/net/ipv4/netfilter
  kernel/net/ipv6/netfilter)
# Of the kernel package only the kernel, its config and those modules (not its 300 MB).
kpatterns=(./boot/* ./lib/modules/*/modules.builtin ./lib/modules/*/modules.order)
for m in "${kmod_paths[@]}"; do kpatterns+=("./lib/modules/*/$m"); done
# (a folder's pattern takes what is in it; one missing from this kernel is no error here:
# the guest says which module it could not load)
dpkg-deb --fsys-tarfile "${debs[0]}" | tar -x -C "$unpacked" --wildcards "${kpatterns[@]}" 2>/dev/null || true
for d in "${debs[@]:1}"; do dpkg-deb -x "$d" "$unpacked"; done
kver="$(ls "$unpacked/lib/modules" | head -n 1)"
kernel="$unpacked/boot/vmlinuz-$kver"
[ -f "$kernel" ] || { log "no kernel image in $kernel_pkg"; exit 1; }
log "kernel $kernel_pkg ($kver)"

# --- the initramfs -------------------------------------------------------------------
stage="$work/initramfs"
rm -rf "$stage"; mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,etc,vm/pki,lib/modules/"$kver"}
# userland: libc, libgcc, libseccomp, the iptables libraries and their extensions
for d in lib lib64 usr/lib usr/lib64; do
  [ -d "$unpacked/$d" ] && cp -a "$unpacked/$d" "$stage/$(dirname "$d")/"
done
rm -rf "$stage/lib/modules"/* "$stage"/usr/lib/*/gconv "$stage/usr/lib/cni"
mkdir -p "$stage/lib/modules/$kver" "$stage/usr/lib/cni"
cp "$unpacked/bin/busybox" "$stage/bin/busybox"
# one link per applet, where the host's busybox (the same package) says it goes
/bin/busybox --list-full | while read -r a; do
  [ "$a" = bin/busybox ] || [ -e "$stage/$a" ] || { mkdir -p "$stage/$(dirname "$a")"; ln -s /bin/busybox "$stage/$a"; }
done
cp -a "$unpacked/usr/sbin/xtables-nft-multi" "$stage/usr/sbin/"
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf xtables-nft-multi "$stage/usr/sbin/$t"
done
for p in bridge host-local loopback portmap; do cp "$unpacked/usr/lib/cni/$p" "$stage/usr/lib/cni/"; done
kmods="$unpacked/lib/modules/$kver"
(cd "$kmods" && find "${kmod_paths[@]}" -name '*.ko' 2>/dev/null) | while read -r m; do
  mkdir -p "$stage/lib/modules/$kver/$(dirname "$m")"
  cp "$kmods/$m" "$stage/lib/modules/$kver/$m"
done
cp "$kmods"/modules.builtin "$kmods"/modules.order "$stage/lib/modules/$kver/"
# the kernel's config where Debian puts it: `holdfast check` reads it
mkdir -p "$stage/boot"
cp "$unpacked/boot/config-$kver" "$stage/boot/"
install -m 0755 "$bin" "$stage/usr/bin/holdfast"
install -m 0755 tests/vm/init "$stage/init"
install -m 0755 tests/vm/guest.sh "$stage/vm/guest.sh"
target/debug/examples/busybox_image "$stage/vm/busybox.tar" docker.io/library/busybox:vm \
  --arch "$goarch" --busybox "$unpacked/bin/busybox" >/dev/null
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$stage/etc/passwd"
printf 'root:x:0:\ntty:x:5:\nnogroup:x:65534:\n' >"$stage/etc/group"
printf '127.0.0.1 localhost\n' >"$stage/etc/hosts"
printf 'nameserver 10.0.2.3\n' >"$stage/etc/resolv.conf"
cat >"$stage/vm/config.yaml.in" <<'YAML'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
fileCheckFrequency: 1s
syncFrequency: 10s
podPidsLimit: 64
authentication:
  x509:
    clientCAFile: /vm/pki/ca.crt
evictionHard:
  memory.available: @MEMORY_AVAILABLE@
  nodefs.available: 5%
  imagefs.available: 5%
holdfast:
  crashLoopBackOffInitial: 1s
  crashLoopBackOffMax: 10s
YAML

# a client CA in the guest, a client certificate for the host's turn
pki="$work/pki"
rm -rf "$pki"; mkdir -p "$pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=vm-test-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/O=system:masters/CN=vm-test" \
  -keyout "$pki/client.key" -out "$pki/client.csr" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' >"$pki/ext"
openssl x509 -req -in "$pki/client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 2 -extfile "$pki/ext" -out "$pki/client.crt" 2>/dev/null
cp "$pki/ca.crt" "$stage/vm/pki/ca.crt"

initrd="$work/initrd.cpio"
(cd "$stage" && find . | /bin/busybox cpio -o -H newc 2>/dev/null) >"$initrd"
log "initramfs $(du -m "$initrd" | cut -f1) MiB; prepared in $((SECONDS - started)) s"

# --- boots ---------------------------------------------------------------------------
disk="$work/disk.img"
rm -f "$disk"
truncate -s 2G "$disk"
mkfs.ext4 -q -F "$disk"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
qemu_pid=
cleanup() {
  [ -n "$qemu_pid" ] && kill -9 "$qemu_pid" 2>/dev/null || true
}
trap cleanup EXIT

results="$work/results"
: >"$results"
boot() { # boot PHASE TIMEOUT: one boot of the guest, its console in $work/console-PHASE.log
  local phase="$1" timeout="$2" con="$work/console-$1.log" port t0=$SECONDS api_done=""
  port="$(free_port)"
  : >"$con"
  "${qemu[@]}" -smp 2 -m 1024 -nodefaults -no-user-config -display none -no-reboot \
    -serial "file:$con" -monitor none \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=$console cgroup_no_v1=all panic=-1 vmtest.phase=$phase" \
    -drive "if=none,id=disk,file=$disk,format=raw" -device virtio-blk-pci,drive=disk \
    -netdev "user,id=net,restrict=on,hostfwd=tcp:127.0.0.1:$port-:10250" \
    -device virtio-net-pci,netdev=net &
  qemu_pid=$!
  local booted=""
  while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ -z "$booted" ] && grep -q 'VMTEST INFO booted' "$con"; then
      booted=$((SECONDS - t0))
      log "phase $phase: at the guest's init after $booted s"
    fi
    if [ -z "$api_done" ] && grep -q '^VMTEST READY api' "$con"; then
      api_done=1
      read -r _ _ _ pod container < <(grep -m1 '^VMTEST READY api' "$con" | tr -d '\r')
      /usr/bin/python3 tests/vm/kubelet_api.py "$port" "$pki/client.crt" "$pki/client.key" "$pod" "$container" \
        >>"$results" 2>&1 || true
    fi
    if [ $((SECONDS - t0)) -gt "$timeout" ]; then
      log "phase $phase: over $timeout s, stopping the guest"
      echo "VMTEST FAIL 0 phase-$phase: over $timeout s" >>"$results"
      kill -9 "$qemu_pid"
      break
    fi
    sleep 1
  done
  wait "$qemu_pid" 2>/dev/null || true
  qemu_pid=
  tr -d '\r' <"$con" | grep -E '^VMTEST (PASS|FAIL|INFO|CHECK|SUMMARY)' >>"$results" || true
  echo "VMTEST INFO phase $phase: boot to init ${booted:-?} s, whole boot $((SECONDS - t0)) s" >>"$results"
  grep -q "^VMTEST DONE $phase\|sysrq: Resetting" <(tr -d '\r' <"$con") \
    || { log "phase $phase ended without finishing; the console's end:"; tail -n 40 "$con" >&2; }
}

if [ "${2:-}" = --shell ]; then
  "${qemu[@]}" -smp 2 -m 1024 -nodefaults -no-user-config -display none -no-reboot \
    -serial mon:stdio -kernel "$kernel" -initrd "$initrd" \
    -append "console=$console cgroup_no_v1=all panic=-1 vmtest.phase=shell" \
    -drive "if=none,id=disk,file=$disk,format=raw" -device virtio-blk-pci,drive=disk \
    -netdev "user,id=net,restrict=on,hostfwd=tcp:127.0.0.1:$(free_port)-:10250" \
    -device virtio-net-pci,netdev=net
  exit 0
fi
boot 1 1500
boot 2 900

grep -E '^VMTEST (INFO|CHECK)' "$results" | sed "s/^VMTEST /vm[$arch]: /"
passed=0 failed=0
for n in 1 2 3 4 5 6 7 8; do
  line="$(grep -E "^VMTEST (PASS|FAIL) $n " "$results" | head -n 1 || true)"
  case "$line" in
    "VMTEST PASS "*) passed=$((passed + 1)); echo "vm[$arch]: ok   ${line#VMTEST PASS }" ;;
    "VMTEST FAIL "*) failed=$((failed + 1)); echo "vm[$arch]: FAIL ${line#VMTEST FAIL }" ;;
    *) failed=$((failed + 1)); echo "vm[$arch]: FAIL $n: no result (see $work/console-*.log)" ;;
  esac
done
grep -E '^VMTEST FAIL 0 ' "$results" | sed "s/^VMTEST FAIL /vm[$arch]: FAIL /" || true
echo "vm[$arch]: $kver, cgroup v2 only, $((SECONDS - started)) s in all"
echo "$passed passed, $failed failed"
# The disk stays for a look when something failed (`mount -o loop,ro`): agent.log is in vm/.
if [ "$failed" -eq 0 ]; then rm -f "$disk"; else echo "vm[$arch]: the guest's disk: $disk"; exit 1; fi
