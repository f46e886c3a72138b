#!/usr/bin/env bash
# The holdfast demo, for a fresh Debian machine, as root: builds holdfast and a busybox
# image, runs a static pod on real containers, shows its log and `holdfast pods`, kills
# the agent with -9 and shows the containers running on, restarts it and shows it adopt
# them, then removes the manifest and shows the pod stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "demo: run as root (containers need it)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
# libseccomp-dev: the default build links libseccomp for RuntimeDefault seccomp profiles.
if ! command -v busybox >/dev/null || ! command -v cargo >/dev/null \
    || ! dpkg -s libseccomp-dev >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq busybox-static gcc libseccomp-dev ca-certificates >/dev/null
  command -v cargo >/dev/null || { apt-get install -y -qq rustup >/dev/null && rustup default stable; }
fi

cargo build --release --quiet --bin holdfast --example busybox_image
bin=target/release/holdfast
demo=/tmp/holdfast-demo
root=$demo/root
manifests=$demo/manifests
rm -rf "$demo"
mkdir -p "$root/images" "$manifests"
# Air-gapped sites pre-load images this way: archives in <root>/images are imported at start.
target/release/examples/busybox_image "$root/images/busybox.tar" docker.io/library/busybox:demo
cp examples/manifests/demo.yaml "$manifests/"
cat > "$demo/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
fileCheckFrequency: 5s
cgroupRoot: /holdfast-demo
holdfast:
  crashLoopBackOffInitial: 2s
  crashLoopBackOffMax: 20s
YAML

agent_pid=
start_agent() {
  "$bin" run --config "$demo/config.yaml" --root-dir "$root" --pod-manifest-path "$manifests" \
    --hostname-override demo-node >>"$demo/agent.log" 2>&1 &
  agent_pid=$!
}
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null || true
  "$bin" reset --root-dir "$root" --cgroup-root /holdfast-demo >/dev/null 2>&1 || true
}
trap cleanup EXIT
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "demo: timed out waiting for $what" >&2; tail -20 "$demo/agent.log" >&2; exit 1; }
    sleep 0.2
  done
}
pods_json() { "$bin" pods --root-dir "$root" -o json; }
ticker_running() { pods_json | grep -q '"name":"ticker"' && "$bin" pods --root-dir "$root" | grep -q 'ticker .*Running'; }
crasher_restarted() { "$bin" pods --root-dir "$root" | grep -Eq 'crasher .*restarts=[1-9]'; }

echo "== starting holdfast (log: $demo/agent.log)"
start_agent
wait_for 60 "the demo pod to run" ticker_running
wait_for 60 "the crasher to be restarted" crasher_restarted
"$bin" pods --root-dir "$root"
log=$(ls "$root"/logs/pods/default_demo-demo-node_*/ticker/0.log)
echo "== $log (CRI format)"
tail -n 3 "$log"

echo "== kill -9 holdfast: the containers keep running"
kill -9 "$agent_pid"; wait "$agent_pid" 2>/dev/null || true; agent_pid=
before=$(wc -l <"$log")
grew() { [ "$(wc -l <"$log")" -gt $((before + 1)) ]; }
wait_for 10 "the ticker to log while the agent is down" grew
echo "ticker wrote $(( $(wc -l <"$log") - before )) more lines with no agent running"

echo "== holdfast again: it adopts its containers"
start_agent
wait_for 30 "the agent to answer" "$bin" pods --root-dir "$root" -o json
"$bin" pods --root-dir "$root"

echo "== manifest removed: the pod is stopped gracefully"
rm "$manifests/demo.yaml"
wait_for 60 "the pod to go" sh -c "! $bin pods --root-dir $root | grep -q demo-demo-node"
"$bin" pods --root-dir "$root"
echo "== demo done"
