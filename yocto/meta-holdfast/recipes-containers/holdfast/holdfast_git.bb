# holdfast from the checkout this layer lives in (or EXTERNALSRC), for development:
# externalsrc builds the working tree as it is, uncommitted changes included. The
# crate fetcher still fetches and unpacks the crates, so holdfast-crates.inc is
# generated from the working tree's Cargo.lock (`python3 yocto/gen-crates-inc.py`).
# The release recipe is preferred; pick this one with
#   PREFERRED_VERSION_holdfast = "0.2.0+git"
# and, for a checkout elsewhere, EXTERNALSRC:pn-holdfast = "/path/to/holdfast".
PV = "0.2.0+git"
DEFAULT_PREFERENCE = "-1"
# Each snapshot a package version of its own, as oe-core gives a recipe fetched with
# git: <version>+git<commits>+<commit> of the checkout's HEAD (with no git, or no
# checkout, plain ${PV}).
PKGV = "${PV}${@holdfast_checkout_rev(d)}"

def holdfast_checkout_rev(d):
    import subprocess
    src = d.getVar('EXTERNALSRC')
    try:
        git = lambda *args: subprocess.check_output(
            ['git', '-C', src] + list(args), stderr=subprocess.DEVNULL, text=True).strip()
        return '%s+%s' % (git('rev-list', '--count', 'HEAD'), git('rev-parse', '--short=10', 'HEAD'))
    except (OSError, subprocess.CalledProcessError):
        return ''

require holdfast-crates.inc
SRC_URI += "file://holdfast.service \
            file://config.yaml \
            file://holdfast-modules.conf \
            "
require holdfast.inc

# The checkout: four folders up from recipes-containers/holdfast/ in
# yocto/meta-holdfast/. A layer copied out of its checkout has none: the recipe is
# skipped until EXTERNALSRC names one.
EXTERNALSRC ?= "${@os.path.normpath(os.path.join(d.getVar('FILE_DIRNAME'), '../../../..'))}"

# nooelint: oelint.task.noanonpython
python () {
    src = d.getVar('EXTERNALSRC')
    if not os.path.isfile(os.path.join(src, 'Cargo.lock')):
        raise bb.parse.SkipRecipe("EXTERNALSRC (%s) is not a holdfast checkout: set EXTERNALSRC:pn-holdfast" % src)
}

inherit externalsrc cargo-update-recipe-crates

# externalsrc drops do_patch, which applies the 32-bit ARM crate patches as its
# postfunc: apply them when the crates are unpacked instead.
do_unpack[postfuncs] += "holdfast_patch_crates"
