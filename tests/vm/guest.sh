#!/bin/sh
# Stage 2, PID 1 of the guest in its tmpfs root: mounts what a Yocto image with systemd
# would (cgroup v2 only), loads the modules, brings up the network and the disk, then runs
# the scenarios of the phase the kernel command line names (`vmtest.phase=1|2`) and turns
# the machine off. Every result is one console line the host reads:
#
#   VMTEST PASS <n> <name>            VMTEST FAIL <n> <name>: <reason>
#   VMTEST INFO <what>                VMTEST READY api <pod>   (the host's kubelet API turn)
#   VMTEST DONE <phase>
#
# Phase 1 runs scenarios 1-7 and ends in a power cut in the middle of pod churn (8);
# phase 2 boots on the same disk and checks what came back.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
umask 022
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t sysfs -o nosuid,nodev,noexec sys /sys
mount -t devtmpfs -o nosuid,mode=755 dev /dev
mkdir -p /dev/pts /dev/shm /sys/fs/cgroup
mount -t devpts -o nosuid,noexec,gid=5,mode=620,ptmxmode=000 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev,mode=1777 shm /dev/shm
mount -t tmpfs -o nosuid,nodev,mode=755 run /run
mount -t tmpfs -o nosuid,nodev,mode=1777 tmp /tmp
# cgroup v2 only: the kernel is booted with cgroup_no_v1=all.
mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate cgroup2 /sys/fs/cgroup
for c in cpuset cpu io memory pids; do
  echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
done
exec </dev/console >/dev/console 2>&1

ARCH=$(uname -m)
PHASE=1
for a in $(cat /proc/cmdline); do
  case "$a" in vmtest.phase=*) PHASE=${a#vmtest.phase=} ;; esac
done
NODE=vm-$(echo "$ARCH" | tr 'A-Z_' 'a-z-')
DISK=/disk
ROOT=$DISK/holdfast
MAN=$DISK/manifests
STATE=$DISK/vm
up() { cut -d' ' -f1 /proc/uptime; }
now() { date +%s; }
info() { echo "VMTEST INFO $*"; }
info "booted phase $PHASE on $(uname -r) $ARCH at uptime $(up) s"

off() {
  sync
  echo "VMTEST DONE $PHASE"
  poweroff -f
  sleep 60
}

# Modules: the dependency list is made here from what the initramfs carries.
depmod
for m in virtio_pci virtio_mmio virtio_blk virtio_net ext4 overlay veth bridge br_netfilter \
         nf_tables nft_compat nft_chain_nat xt_MASQUERADE xt_conntrack xt_comment xt_mark \
         xt_addrtype xt_multiport xt_nat; do
  modprobe "$m" || info "modprobe $m failed"
done
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 kernel.sysrq=1 \
  kernel.panic_on_oops=1 vm.overcommit_memory=1 >/dev/null 2>&1 || true
hostname "$NODE"
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2 \
  || info "no eth0: the host's kubelet API turn will fail"

i=0
until [ -b /dev/vda ] || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
mkdir -p $DISK
if ! mount -t ext4 -o nosuid,nodev /dev/vda $DISK; then
  echo "VMTEST FAIL 0 disk: cannot mount /dev/vda as ext4"
  off
fi
mkdir -p $ROOT/images $MAN $STATE/init-runs /run/vmtest
BOOT_ID=$(cat /proc/sys/kernel/random/boot_id)
info "ready at uptime $(up) s"

PASSED=0
FAILED=0
pass() { echo "VMTEST PASS $1 $2"; PASSED=$((PASSED + 1)); }
fail() { echo "VMTEST FAIL $1 $2: $3"; FAILED=$((FAILED + 1)); }
# wait_for SECONDS COMMAND...: polls COMMAND every 0.5 s until it succeeds or time is up.
wait_for() {
  _deadline=$(($(now) + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$(now)" -lt "$_deadline" ] || return 1
    sleep 0.5
  done
}

# The agent's config: memory.available's threshold is MemAvailable at the first boot
# less 350 MiB, kept on the disk for the boots after it.
write_config() {
  if [ ! -s $STATE/threshold ]; then
    avail_kib=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
    echo "$(( avail_kib / 1024 - 350 ))Mi" >$STATE/threshold
  fi
  # The pods' cgroups inside the subtree systemd delegates to holdfast.service, as the
  # Yocto layer ships it.
  sed -e "s/@MEMORY_AVAILABLE@/$(cat $STATE/threshold)/" -e '/^kind:/a cgroupRoot: delegated' \
    /vm/config.yaml.in >/vm/config.yaml
  info "evictionHard memory.available $(cat $STATE/threshold)"
}
AGENT=
agent_up() { holdfast status --root-dir $ROOT --json | grep -q '"agentRunning":true'; }
# holdfast.service's cgroup as systemd makes it for Delegate=yes: the controllers enabled
# down to it, nothing inside it.
UNIT=/sys/fs/cgroup/system.slice/holdfast.service
delegate_unit() {
  mkdir -p $UNIT
  for c in cpu memory pids; do
    echo "+$c" >/sys/fs/cgroup/system.slice/cgroup.subtree_control 2>/dev/null || true
  done
}
start_agent() {
  delegate_unit
  # Where systemd >= 254 starts it with DelegateSubgroup=supervisor, every time.
  mkdir -p $UNIT/supervisor
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$UNIT/supervisor" \
    holdfast run --config /vm/config.yaml --root-dir $ROOT --pod-manifest-path $MAN \
    --hostname-override "$NODE" >>$STATE/agent.log 2>&1 &
  AGENT=$!
  wait_for 60 agent_up
}
# delegated POD...: what is wrong with the agent's and the pods' cgroups under
# cgroupRoot: delegated (nothing when all is well).
delegated() {
  _bad=""
  _own=$(grep '^0::' /proc/$AGENT/cgroup)
  [ "$_own" = "0::/system.slice/holdfast.service/supervisor" ] || _bad="$_bad; agent in $_own"
  [ -z "$(cat $UNIT/cgroup.procs)" ] \
    || _bad="$_bad; processes in holdfast.service itself: $(cat $UNIT/cgroup.procs | tr '\n' ' ')"
  for _n in "$@"; do
    _pcg=$(pod_cgroup "$(pod_uid "$_n")")
    case "$_pcg" in
      $UNIT/pods/kubepods/*) ;;
      *) _bad="$_bad; $_n's cgroup '$_pcg' not under holdfast.service/pods/kubepods" ;;
    esac
  done
  [ -e /sys/fs/cgroup/holdfast ] && _bad="$_bad; /sys/fs/cgroup/holdfast made"
  echo "$_bad"
}
# hello's container's processes, by its cgroup (its init first, then its loop's sleep).
hello_pids() { cat "$(container_cgroup "$(pod_cgroup "$(pod_uid hello)")")/cgroup.procs" | tr '\n' ' '; }
agent_tail() { tail -n 15 $STATE/agent.log | sed 's/^/VMTEST LOG /'; }

# One pod's JSON (a line) from `holdfast pods -o json`, by manifest name.
pod() {
  holdfast pods --root-dir $ROOT -o json | sed 's/{"pod":{/\n&/g' | grep "\"name\":\"$1-$NODE\""
}
# field POD KEY: the first string or number value of KEY in the pod's JSON.
field() {
  pod "$1" | grep -o "\"$2\":\"*[^\",}]*" | head -n 1 | sed 's/^"[^"]*":"*//'
}
running() { # running POD: the pod is Running and every container is ready
  pod "$1" | grep -q '"phase":"Running"' && ! pod "$1" | grep -q '"ready":false'
}
manifest() { # manifest NAME: writes stdin to MAN/NAME.yaml at once (rename)
  cat >"$MAN/.$1.tmp" && mv "$MAN/.$1.tmp" "$MAN/$1.yaml"
}
pod_uid() { pod "$1" | grep -o '"uid":"[^"]*"' | head -n 1 | cut -d'"' -f4; }

# ---------------------------------------------------------------------------------------
# The workloads of phase 1.
pods_phase1() {
  manifest hello <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: hello}
spec:
  hostNetwork: true
  containers:
  - name: hello
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "echo hello from $(uname -m); while true; do echo tick; sleep 1; done"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  volumes:
  - {name: shared, hostPath: {path: /run/vmtest, type: Directory}}
EOF
}

scenario_check() {
  out=$(holdfast check --root-dir $ROOT 2>&1)
  rc=$?
  echo "$out" | sed 's/^/VMTEST CHECK /'
  [ $rc -eq 0 ] || { fail 1 check "holdfast check exited $rc"; return; }
  echo "$out" | grep -q 'cgroups: v2 (cgroup2 at /sys/fs/cgroup)' \
    || { fail 1 check "cgroup v2 not reported"; return; }
  pass 1 check
}

scenario_static_pod() {
  pods_phase1
  if ! wait_for 180 running hello; then
    fail 2 static-pod "hello not Running in 180 s"; agent_tail; return
  fi
  info "hello Running at uptime $(up) s"
  log=$(ls $ROOT/logs/pods/default_hello-${NODE}_*/hello/0.log 2>/dev/null | head -n 1)
  [ -n "$log" ] || { fail 2 static-pod "no CRI log file for hello"; return; }
  grep -q " stdout F hello from $ARCH\$" "$log" \
    || { fail 2 static-pod "no 'stdout F hello from $ARCH' in $log: $(head -c 200 "$log")"; return; }
  holdfast pods --root-dir $ROOT | grep -q "hello-$NODE.*Running" \
    || { fail 2 static-pod "holdfast pods does not show hello Running"; return; }
  pass 2 static-pod
}

# The cgroup of pod UID (kubelet's cgroupfs names: .../kubepods[/<qos>]/pod<uid>).
pod_cgroup() { find /sys/fs/cgroup -type d -name "pod$1" | head -n 1; }
live() { # live POD: the number of its container cgroups with a process in them
  pcg=$(pod_cgroup "$(pod_uid "$1")")
  k=0
  # (cgroup files have no size: -s would never be true)
  [ -n "$pcg" ] && for d in "$pcg"/*/; do [ -n "$(cat "$d/cgroup.procs" 2>/dev/null)" ] && k=$((k + 1)); done
  echo $k
}
container_cgroup() { # container_cgroup PODCG: the one child of the pod's cgroup
  for d in "$1"/*/; do [ -f "$d/memory.max" ] && echo "${d%/}" && return; done
}

scenario_resources() {
  manifest res <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: res}
spec:
  containers:
  - name: main
    image: docker.io/library/busybox:vm
    command: ["sleep", "1000000"]
    resources:
      requests: {cpu: 250m, memory: 32Mi}
      limits: {cpu: 500m, memory: 64Mi}
EOF
  manifest oom <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  restartPolicy: Never
  containers:
  - name: eat
    image: docker.io/library/busybox:vm
    command: ["dd", "if=/dev/zero", "of=/dev/null", "bs=96M", "count=1"]
    resources:
      limits: {memory: 32Mi}
EOF
  if ! wait_for 120 running res; then
    fail 3 cgroup-v2-resources "res not Running in 120 s"; agent_tail; return
  fi
  uid=$(pod_uid res)
  pcg=$(pod_cgroup "$uid")
  [ -n "$pcg" ] || { fail 3 cgroup-v2-resources "no cgroup pod$uid"; return; }
  info "res pod cgroup $pcg"
  ccg=$(container_cgroup "$pcg")
  [ -n "$ccg" ] || { fail 3 cgroup-v2-resources "no container cgroup under $pcg"; return; }
  qos=$(dirname "$pcg")
  kubepods=$(dirname "$qos")
  bad=""
  [ "$(basename "$qos")" = burstable ] || bad="$bad; pod not under burstable ($qos)"
  [ "$(basename "$kubepods")" = kubepods ] || bad="$bad; no kubepods above $qos"
  [ -d "$kubepods/besteffort" ] || bad="$bad; no $kubepods/besteffort"
  [ "$(cat "$ccg/memory.max")" = 67108864 ] || bad="$bad; memory.max $(cat "$ccg/memory.max")"
  [ "$(cat "$ccg/cpu.max")" = "50000 100000" ] || bad="$bad; cpu.max $(cat "$ccg/cpu.max")"
  # requests 250m = 256 shares. cpu.weight as runc >= 1.3.2, crun >= 1.23 and the kubelet's
  # own cgroup code map shares on v2 (so 1024 shares, one CPU, stays weight 100):
  # ceil(10^((l^2 + 125 l) / 612 - 7/34)) with l = log2(shares) = 8, which is 35.
  # (The linear map before it, 1 + (shares - 2) * 9999 / 262142, gave 10.)
  [ "$(cat "$ccg/cpu.weight")" = 35 ] || bad="$bad; cpu.weight $(cat "$ccg/cpu.weight")"
  [ "$(cat "$pcg/cpu.weight")" = 35 ] || bad="$bad; pod cpu.weight $(cat "$pcg/cpu.weight")"
  [ "$(cat "$pcg/pids.max")" = 64 ] || bad="$bad; pod pids.max $(cat "$pcg/pids.max") (podPidsLimit 64)"
  [ "$(cat "$pcg/memory.max")" = 67108864 ] || bad="$bad; pod memory.max $(cat "$pcg/memory.max")"
  info "res: memory.max $(cat "$ccg/memory.max") cpu.max '$(cat "$ccg/cpu.max")' cpu.weight $(cat "$ccg/cpu.weight") (pod $(cat "$pcg/cpu.weight")) pids.max $(cat "$pcg/pids.max")"
  # cgroupRoot: delegated: all of it inside holdfast.service, the agent in
  # holdfast.service/supervisor, the unit itself empty.
  bad="$bad$(delegated hello res)"
  # A process in the unit itself is refused now (EBUSY): why the agent does not honour
  # delegated when systemd < 254 starts it there (the next start would fail).
  sleep 600 &
  if echo $! >$UNIT/cgroup.procs 2>/dev/null; then bad="$bad; holdfast.service took a process"; fi
  kill $!
  info "delegated: agent $(grep '^0::' /proc/$AGENT/cgroup), supervisor holds $(wc -l <$UNIT/supervisor/cgroup.procs) processes, holdfast.service hands on '$(cat $UNIT/cgroup.subtree_control)', pods/ '$(cat $UNIT/pods/cgroup.subtree_control)'"
  oom_done() { pod oom | grep -q '"terminated":{'; }
  if ! wait_for 120 oom_done; then
    bad="$bad; oom's container did not end in 120 s"
  else
    pod oom | grep -q '"reason":"OOMKilled"' || bad="$bad; oom not OOMKilled: $(pod oom | grep -o '"terminated":{[^}]*}')"
    pod oom | grep -q '"exitCode":137' || bad="$bad; oom exit code not 137"
    pod oom | grep -q '"phase":"Failed"' || bad="$bad; oom pod not Failed"
  fi
  if [ -n "$bad" ]; then fail 3 cgroup-v2-resources "${bad#; }"; else pass 3 cgroup-v2-resources; fi
}

scenario_adoption() {
  manifest quitter <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: quitter}
spec:
  restartPolicy: Never
  containers:
  - name: q
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "touch /tmp/started; sleep 6; exit 7"]
EOF
  if ! wait_for 120 running quitter; then
    fail 4 kill-9-adoption "quitter not Running in 120 s"; agent_tail; return
  fi
  hello_id=$(pod hello | grep -o '"containerID":"[^"]*"' | head -n 1)
  init=$(hello_pids | cut -d' ' -f1)
  log=$(ls $ROOT/logs/pods/default_hello-${NODE}_*/hello/0.log | head -n 1)
  kill -9 "$AGENT"
  wait "$AGENT" 2>/dev/null
  killed=$(now)
  before=$(wc -l <"$log")
  grew() { [ "$(wc -l <"$log")" -ge $((before + 3)) ]; }
  bad=""
  wait_for 30 grew || bad="$bad; hello's log did not grow with the agent down"
  # quitter's `sleep 6` is gone once its container has exited.
  quit() { ! ps | grep -q '[s]leep 6$'; }
  wait_for 60 quit || bad="$bad; quitter still running after 60 s"
  back=$(now)
  start_agent || { fail 4 kill-9-adoption "agent did not answer after restart"; agent_tail; return; }
  ended() { pod quitter | grep -q '"exitCode":7'; }
  if wait_for 60 ended; then
    fin=$(pod quitter | grep -o '"finishedAt":"[^"]*"' | head -n 1 | cut -d'"' -f4)
    fin_s=$(date -u -D '%Y-%m-%dT%H:%M:%SZ' -d "$fin" +%s 2>/dev/null || echo 0)
    if [ "$fin_s" -lt $((killed - 1)) ] || [ "$fin_s" -gt $((back + 1)) ]; then
      bad="$bad; quitter finishedAt $fin not between the kill ($killed) and the restart ($back)"
    fi
  else
    bad="$bad; quitter's exit code 7 not reported: $(pod quitter | grep -o '"state":{[^}]*}')"
  fi
  wait_for 30 running hello || bad="$bad; hello not Running after adoption"
  [ "$(pod hello | grep -o '"containerID":"[^"]*"' | head -n 1)" = "$hello_id" ] \
    || bad="$bad; hello's container was replaced, not adopted"
  pod hello | grep -q '"restartCount":0' || bad="$bad; hello restarted"
  # Started again in holdfast.service/supervisor: hello's processes adopted where they were.
  bad="$bad$(delegated hello)"
  case " $(hello_pids)" in
    *" $init "*) ;;
    *) bad="$bad; hello's init $init is not in its container's cgroup: '$(hello_pids)'" ;;
  esac
  if [ -n "$bad" ]; then fail 4 kill-9-adoption "${bad#; }"; agent_tail; else pass 4 kill-9-adoption; fi
}

scenario_cni() {
  manifest web <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: web
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "mkdir -p /www && echo web-ok > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: [{containerPort: 8080, hostPort: 18080}]
EOF
  if ! wait_for 120 running web; then
    fail 5 cni-bridge-portmap "web not Running in 120 s"; agent_tail; return
  fi
  WEB_IP=$(field web podIP)
  WEB_SINCE=$(now)
  CNI_BAD=""
  case "$WEB_IP" in 10.88.*) ;; *) CNI_BAD="$CNI_BAD; podIP '$WEB_IP' not from the pod CIDR 10.88.0.0/16" ;; esac
  web_answers "$WEB_IP" || CNI_BAD="$CNI_BAD; http://$WEB_IP:8080/ did not answer web-ok"
  info "web podIP $WEB_IP; bridge $(ip -o -4 addr show holdfast0 2>/dev/null | awk '{print $4}')"
}
# GET / of web through its pod IP and through the hostPort (portmap) on eth0's address.
# (busybox wget resolves the port's service name through glibc's NSS, which a static
# binary cannot load: it crashes. nc takes numbers.)
http_ok() { printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$1" "$2" 2>/dev/null | tail -n 1 | grep -qx web-ok; }
web_answers() {
  wait_for 30 http_ok "$1" 8080 || return 1
  wait_for 30 http_ok 10.0.2.15 18080
}
# Scenario 5's verdict, two sync periods (syncFrequency 10s) after web started: still the
# same address, still answering, and its network not torn down and made again by a
# failing CNI CHECK.
scenario_cni_verdict() {
  wait_for 60 sh -c "[ \$(date +%s) -ge $((WEB_SINCE + 25)) ]"
  [ "$(field web podIP)" = "$WEB_IP" ] || CNI_BAD="$CNI_BAD; podIP changed from $WEB_IP to $(field web podIP)"
  web_answers "$WEB_IP" || CNI_BAD="$CNI_BAD; web stopped answering on $WEB_IP:8080 or hostPort 18080"
  grep -q "network check failed" $STATE/agent.log && CNI_BAD="$CNI_BAD; $(grep -m1 'network check failed' $STATE/agent.log)"
  if [ -n "$CNI_BAD" ]; then fail 5 cni-bridge-portmap "${CNI_BAD#; }"; agent_tail; else pass 5 cni-bridge-portmap; fi
}

scenario_liveness_eviction() {
  manifest live <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: live}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: live
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "touch /tmp/healthy; sleep 4; rm /tmp/healthy; sleep 1000000"]
    livenessProbe:
      exec: {command: ["cat", "/tmp/healthy"]}
      periodSeconds: 2
      failureThreshold: 1
EOF
  bad=""
  restarted() { pod live | grep -q '"restartCount":[1-9]'; }
  wait_for 120 restarted || bad="$bad; live not restarted by its liveness probe in 120 s"
  # memory.available on v2: the threshold is MemAvailable at boot less 350 MiB
  # (config.yaml); hog fills a 400 MiB memory-backed emptyDir. Static pods are critical
  # and the kubelet evicts none of them, so the agent must see the signal cross its
  # threshold, say so with what it read, and leave every pod running.
  manifest hog <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "dd if=/dev/zero of=/fill/x bs=1M count=400; sleep 1000000"]
    volumeMounts: [{name: fill, mountPath: /fill}]
  volumes:
  - {name: fill, emptyDir: {medium: Memory}}
EOF
  seen() { grep -q "eviction: memory.available is [0-9]* bytes, below its threshold" $STATE/agent.log; }
  if ! grep -q "eviction:" $STATE/agent.log && wait_for 180 seen; then
    line=$(grep -m1 "eviction: memory.available is" $STATE/agent.log)
    read_b=$(echo "$line" | sed 's/.*memory.available is \([0-9]*\) bytes.*/\1/')
    avail_b=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
    info "agent: ${line#*] }; MemAvailable now $avail_b bytes"
    # What the agent read against the kernel's own figure, within 64 MiB.
    diff=$((read_b - avail_b)); [ $diff -lt 0 ] && diff=$((-diff))
    [ $diff -le 67108864 ] || bad="$bad; memory.available read $read_b bytes, MemAvailable $avail_b"
  else
    bad="$bad; no memory.available threshold crossing logged in 180 s, or one before hog ($(grep -m1 'eviction:' $STATE/agent.log))"
  fi
  for p in hello res web live hog; do
    pod $p | grep -q '"reason":"Evicted"' && bad="$bad; static pod $p evicted"
  done
  rm -f $MAN/hog.yaml
  if [ -n "$bad" ]; then fail 7 liveness-eviction "${bad#; }"; agent_tail; else pass 7 liveness-eviction; fi
}

churn_pod() { # churn_pod N: a pod with an init container that records the boot it ran in
  manifest "c$1" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: c$1}
spec:
  initContainers:
  - name: init
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "cat /proc/sys/kernel/random/boot_id >> /runs/c$1"]
    volumeMounts: [{name: runs, mountPath: /runs}]
  containers:
  - name: main
    image: docker.io/library/busybox:vm
    command: ["sleep", "1000000"]
  volumes:
  - {name: runs, hostPath: {path: $STATE/init-runs, type: Directory}}
EOF
}

powercut() {
  # Pods c1..c4 go in and are synced to the disk: they must all come back (but for c1
  # and c3, removed below). Then churn: c5..c10 added, each as soon as the agent knows
  # the one before, and c1, c3 removed, while the agent starts and stops them; then the
  # power goes, with none of that flushed to the disk.
  # Also `ended`, a Never pod whose container exits 3 while the agent runs, just before
  # the cut (when it is told to, once its manifest is synced): the agent takes the exit
  # into its store, so its shim never syncs the exit record; once the agent reports it,
  # the exit must survive the cut (and the pod never run again).
  manifest ended <<EOF
apiVersion: v1
kind: Pod
metadata: {name: ended}
spec:
  restartPolicy: Never
  containers:
  - name: e
    image: docker.io/library/busybox:vm
    command: ["sh", "-c", "cat /proc/sys/kernel/random/boot_id >> /runs/ended; until [ -f /runs/end ]; do sleep 0.2; done; exit 3"]
    volumeMounts: [{name: runs, mountPath: /runs}]
  volumes:
  - {name: runs, hostPath: {path: $STATE/init-runs, type: Directory}}
EOF
  for n in 1 2 3 4; do churn_pod $n; done
  for n in 1 2 3 4; do wait_for 120 running c$n || info "c$n not Running before the cut"; done
  wait_for 120 running ended || info "ended not Running before the cut"
  sync
  ls $MAN | grep -v '^c[13]\.yaml$' >$STATE/synced-manifests
  sync
  known() { pod "$1" >/dev/null; }
  for n in 5 6 7 8 9 10; do
    churn_pod $n
    case $n in 6) rm -f $MAN/c1.yaml ;; 8) rm -f $MAN/c3.yaml ;; esac
    wait_for 30 known c$n || info "c$n not known to the agent before the cut"
  done
  touch $STATE/init-runs/end
  ended() { pod ended | grep -q '"exitCode":3'; }
  wait_for 60 ended || info "ended's exit code 3 not reported before the cut"
  info "power cut at uptime $(up) s with $(ls $MAN | wc -l) manifests"
  echo b >/proc/sysrq-trigger
  sleep 60
}

phase1() {
  info "MemAvailable $(grep MemAvailable /proc/meminfo)"
  write_config
  cp /vm/busybox.tar $ROOT/images/
  scenario_check
  t=$(now)
  start_agent || { fail 2 static-pod "agent did not answer in 60 s"; agent_tail; }
  info "agent answering after $(($(now) - t)) s"
  scenario_static_pod
  scenario_resources
  scenario_adoption
  scenario_cni
  # The host's turn: exec, logs and /stats/summary through the kubelet API. Its last
  # exec writes /shared/api-done in hello (/run/vmtest here).
  echo "VMTEST READY api hello-$NODE hello"
  scenario_liveness_eviction
  scenario_cni_verdict
  done_api() { [ -f /run/vmtest/api-done ]; }
  wait_for 300 done_api || info "the host's kubelet API turn did not finish in 300 s"
  rm -f $MAN/oom.yaml $MAN/quitter.yaml $MAN/live.yaml
  echo "VMTEST SUMMARY phase 1: $PASSED passed, $FAILED failed"
  powercut
}

phase2() {
  write_config
  t=$(now)
  start_agent || { fail 8 power-cut "agent did not answer in 60 s after the cut"; agent_tail; off; }
  info "agent answering $(($(now) - t)) s after start, uptime $(up) s"
  bad=""
  grep -q "moved aside" $STATE/agent.log && bad="$bad; the store was moved aside"
  holdfast pods --root-dir $ROOT 2>&1 | grep -q WARNING && bad="$bad; holdfast pods warns"
  for f in $(cat $STATE/synced-manifests); do
    [ -f "$MAN/$f" ] || bad="$bad; synced manifest $f lost"
  done
  # The pods are the manifests the disk holds: a manifest whose rename the cut undid is
  # gone, and one the cut left empty keeps the pods the agent read from it before.
  names=$(ls $MAN | sed -n 's/\.yaml$//p' | grep -vx ended)
  # `ended`, whose exit the agent took before the cut, says so still, and did not run
  # again.
  pod ended | grep -q '"exitCode":3' && pod ended | grep -q '"phase":"Failed"' \
    || bad="$bad; ended's exit code 3 lost in the cut: $(pod ended | grep -o '"containerStatuses":.*' | head -c 400)"
  grep -qx "$BOOT_ID" $STATE/init-runs/ended 2>/dev/null && bad="$bad; ended ran again after the cut"
  info "manifests after the cut: $(ls -s $MAN | tr '\n' ' ')"
  # Running as reported, and running for real.
  all_running() { for n in $names; do running "$n" && [ "$(live "$n")" = 1 ] || return 1; done; }
  wait_for 300 all_running && info "every pod Running $(($(now) - t)) s after the agent's start"
  for n in $names; do
    running "$n" || bad="$bad; $n not Running 300 s after the agent's start"
  done
  for n in $names; do
    c=$(holdfast pods --root-dir $ROOT -o json | sed 's/{"pod":{/\n&/g' | grep -c "\"name\":\"$n-$NODE\"")
    [ "$c" = 1 ] || bad="$bad; $n listed $c times"
    case $n in c*)
      grep -qx "$BOOT_ID" $STATE/init-runs/$n 2>/dev/null || bad="$bad; $n's init container did not run again"
    esac
    k=$(live "$n")
    [ "$k" = 1 ] || bad="$bad; $n has $k running containers"
  done
  # A pod whose manifest the cut took (or that was removed) is not started even once.
  for f in $STATE/init-runs/c*; do
    n=$(basename "$f")
    [ -f "$MAN/$n.yaml" ] && continue
    grep -qx "$BOOT_ID" "$f" && bad="$bad; $n has no manifest but its init container ran again"
  done
  # Every pod the agent reports is one with a manifest: none came back from the dead.
  for n in $(holdfast pods --root-dir $ROOT -o json | grep -o "\"name\":\"[a-z0-9-]*-$NODE\"" | cut -d'"' -f4); do
    [ -f "$MAN/${n%-$NODE}.yaml" ] || bad="$bad; $n runs with no manifest"
  done
  info "after the cut: $(echo $names | wc -w) pods: $(echo $names)"
  if [ -n "$bad" ]; then fail 8 power-cut "${bad#; }"; agent_tail; else pass 8 power-cut; fi
  echo "VMTEST SUMMARY phase 2: $PASSED passed, $FAILED failed"
  kill "$AGENT"
  wait_for 30 sh -c "! kill -0 $AGENT"
}

case "$PHASE" in
  1) phase1 ;;
  2) phase2 ;;
  shell) # tests/vm/run.sh ARCH --shell: the machine as the scenarios find it, by hand
    sed "s/@MEMORY_AVAILABLE@/100Mi/" /vm/config.yaml.in >/vm/config.yaml
    cp /vm/busybox.tar $ROOT/images/
    export ROOT MAN NODE
    echo "root dir $ROOT, manifests $MAN; start_agent: holdfast run --config /vm/config.yaml --root-dir \$ROOT --pod-manifest-path \$MAN --hostname-override \$NODE &"
    setsid cttyhack sh -l ;;
esac
off
