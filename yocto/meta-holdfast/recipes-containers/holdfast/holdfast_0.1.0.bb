# holdfast at a released commit, fetched with git. PV is the `version` in Cargo.toml at
# SRCREV, and holdfast-${PV}-crates.inc is generated from SRCREV's Cargo.lock:
# `python3 yocto/gen-crates-inc.py --rev <commit>` moves both, `--check-release`
# checks them. holdfast_git.bb builds the checkout the layer lives in instead.

# Where holdfast's sources are fetched from: the repository (host and path, as in
# a git:// URL) and the fetcher's parameters. Point them at your mirror or fork in
# local.conf or a bbappend, e.g. HOLDFAST_GIT_REPO = "git@git.example.com/edge/holdfast.git"
# with HOLDFAST_GIT_PARAMS = "protocol=ssh;branch=main", and set SRCREV to the
# commit to build.
HOLDFAST_GIT_REPO ?= "github.com/holdfast-agent/holdfast.git"
HOLDFAST_GIT_PARAMS ?= "protocol=https;branch=main"

SRC_URI = "git://${HOLDFAST_GIT_REPO};${HOLDFAST_GIT_PARAMS} \
           file://holdfast.service \
           file://config.yaml \
           file://holdfast-modules.conf \
           "
SRCREV = "88abc5e1f73451f42777626d4e9c0e0b62911bd9"

require holdfast-${PV}-crates.inc
require holdfast.inc

