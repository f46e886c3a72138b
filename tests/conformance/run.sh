#!/usr/bin/env bash
# The upstream node conformance suite against holdfast, as root on a Debian machine:
# installs what it needs, builds holdfast, starts the envtest control plane, a registry
# with the suite's images and holdfast as the node, runs the selected [NodeConformance]
# specs in several processes and ends with `N passed, M failed`, each failure listed.
# Results: target/conformance/ (node-conformance.txt, each process's log and JUnit).
#
#   bash tests/conformance/run.sh                       # every selected spec, [Slow] too
#   CONFORMANCE_FOCUS='ConfigMap|Secrets' bash tests/conformance/run.sh   # some of them
#   CONFORMANCE_PROCS=6 CONFORMANCE_SLOW=0 bash tests/conformance/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export DEBIAN_FRONTEND=noninteractive
bash .ci/apt-install busybox-static gcc libc6-dev libseccomp-dev docker-registry skopeo umoci \
  containernetworking-plugins iptables iproute2 openssl xz-utils
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  KUBEBUILDER_ASSETS=$(bash ../shared/envtest/setup.sh)
  export KUBEBUILDER_ASSETS
fi
export CARGO_INCREMENTAL=0
cargo build --quiet --bins
exec cargo test --quiet --test conformance -- --ignored --nocapture node_conformance
