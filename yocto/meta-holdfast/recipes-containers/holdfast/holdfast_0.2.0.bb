# holdfast at a release: the commit tagged v${PV}, fetched with git (the fetcher
# checks that the tag names SRCREV). PV is the `version` in Cargo.toml at SRCREV, and
# holdfast-${PV}-crates.inc is generated from SRCREV's Cargo.lock:
# `python3 yocto/gen-crates-inc.py --rev v<version>` moves both, `--check-release`
# checks them (see "Releasing" in the layer's README). holdfast_git.bb builds the
# checkout the layer lives in instead, as ${PV}+git.

# Where holdfast's sources are fetched from: the repository (host and path, as in
# a git:// URL) and the fetcher's parameters. Point them at your mirror or fork in
# local.conf or a bbappend, e.g. HOLDFAST_GIT_REPO = "git@git.example.com/edge/holdfast.git"
# with HOLDFAST_GIT_PARAMS = "protocol=ssh;branch=main", and set SRCREV to the
# commit to build.
HOLDFAST_GIT_REPO ?= "github.com/holdfast-agent/holdfast.git"
HOLDFAST_GIT_PARAMS ?= "protocol=https;branch=main"

SRC_URI = "git://${HOLDFAST_GIT_REPO};${HOLDFAST_GIT_PARAMS};tag=v${PV} \
           file://holdfast.service \
           file://config.yaml \
           file://holdfast-modules.conf \
           "
SRCREV = "6a26f7a05269df655f119c1aca64a2e2f5d615ab"

require holdfast-${PV}-crates.inc
require holdfast.inc

