#!/usr/bin/env bash
# The holdfast demo, for a fresh Debian machine, as root: builds holdfast and a busybox
# image, runs a static pod on real containers, shows its log and `holdfast pods`, kills
# the agent with -9 and shows the containers running on, restarts it and shows it adopt
# them, then removes the manifest and shows the pod stopped, with the container's last
# words. Installs what the build needs (Debian packages; Rust through rustup when there
# is none). The kubelet API listens on 127.0.0.1 only; the demo's folder,
# /tmp/holdfast-demo, is removed at the end (HOLDFAST_DEMO_KEEP=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "demo: run as root (containers need it)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
step=0
say() { step=$((step + 1)); printf '\n== %d/7 %s\n' "$step" "$*"; }

say "what the build needs: a C compiler, libseccomp, busybox, Rust $(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml) or newer"
# libseccomp-dev: the default build links libseccomp for RuntimeDefault seccomp profiles.
if ! command -v busybox >/dev/null || ! command -v cc >/dev/null \
    || ! dpkg -s libseccomp-dev >/dev/null 2>&1; then
  for try in 1 2 3; do
    apt-get update -qq || true
    apt-get install -y -qq busybox-static gcc libc6-dev libseccomp-dev ca-certificates curl >/dev/null && break
    [ "$try" = 3 ] && { echo "demo: apt-get could not install the build's packages" >&2; exit 1; }
    sleep $((try * 10))
  done
fi
# Debian's own Rust is too old for holdfast (Debian 12 has 1.63): rustup's stable.
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
if ! command -v rustup >/dev/null; then
  command -v curl >/dev/null || apt-get install -y -qq curl ca-certificates >/dev/null
  echo "installing Rust with rustup (https://rustup.rs) into $HOME/.cargo"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --no-modify-path >/dev/null
  . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || rustup default stable
want=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml)
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
  echo "demo: rustc $have is older than the $want holdfast needs: rustup update stable" >&2
  exit 1
fi
echo "rustc $have, $(command -v cargo)"

say "building holdfast (release) and a busybox image: a few minutes the first time"
cargo build --release --bin holdfast --example busybox_image
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
address: 127.0.0.1            # the kubelet API on this machine only
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
tail_pid=
cleanup() {
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null || true
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null || true
  "$bin" reset --root-dir "$root" --cgroup-root /holdfast-demo >/dev/null 2>&1 || true
  if [ "${HOLDFAST_DEMO_KEEP:-}" = 1 ]; then
    echo "demo: its files stay in $demo (agent.log, config.yaml, root/)"
  else
    rm -rf "$demo"
    echo "demo: removed $demo (HOLDFAST_DEMO_KEEP=1 keeps it)"
  fi
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
pods() { "$bin" pods --root-dir "$root"; }
ticker_running() { pods | grep -Eq '^└ ticker +Running'; }
crasher_restarted() { pods | grep -Eq '^└ crasher +[A-Za-z]+ +[0-9]/1 +[1-9]'; }

say "starting holdfast with the demo pod (files in $demo, agent log $demo/agent.log)"
start_agent
wait_for 60 "the demo pod to run" ticker_running
wait_for 60 "the crasher to be restarted" crasher_restarted
pods
log=$(ls "$root"/logs/pods/default_demo-demo-node_*/ticker/0.log)
say "the ticker's log, as the kubelet writes it (CRI format): $log"
tail -n 3 "$log"

say "kill -9 holdfast: the containers keep running"
kill -9 "$agent_pid"; wait "$agent_pid" 2>/dev/null || true; agent_pid=
before=$(wc -l <"$log")
grew() { [ "$(wc -l <"$log")" -gt $((before + 1)) ]; }
wait_for 10 "the ticker to log while the agent is down" grew
echo "the ticker wrote $(( $(wc -l <"$log") - before )) more lines with no agent running"

say "holdfast again: it adopts its containers (same container IDs, no restart)"
start_agent
wait_for 30 "the agent to answer" "$bin" pods --root-dir "$root" -o json
pods

say "manifest removed: the pod is stopped gracefully (SIGTERM, then its grace period)"
# The log goes with the pod: follow it until the ticker's last words are in.
: >"$demo/last-words"
tail -n 0 -F "$log" >>"$demo/last-words" 2>/dev/null &
tail_pid=$!
rm "$manifests/demo.yaml"
said_bye() { grep -q 'got SIGTERM' "$demo/last-words"; }
wait_for 30 "the ticker's last words" said_bye
kill "$tail_pid" 2>/dev/null || true
echo "the ticker's last words, from its log:"
tail -n 2 "$demo/last-words"
wait_for 60 "the pod to go" sh -c "! $bin pods --root-dir $root | grep -q demo-demo-node"
echo "holdfast pods, with the pod gone:"
pods
printf '\n== done: the pod ran, outlived its agent, was adopted and stopped cleanly\n'
