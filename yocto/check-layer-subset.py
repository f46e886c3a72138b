#!/usr/bin/env python3
"""Runs oe-core's yocto-check-layer test cases that need no world build on one layer,
in the current build dir (oe-init-build-env sourced, the layer in bblayers.conf).

yocto-check-layer itself parses every recipe at least three times (oe-core alone for
the initial signatures, then with the layer, then with its yocto-check-layer class
inherited) and runs `bitbake -S lockedsigs world` each time: about 11 minutes on two
cores, longer than CI has for it. This runs the tool's own test methods
(checklayer.cases.common.CommonCheckLayer) on the parse the build dir already has:
test_readme, test_security, test_layerseries_compat, test_patches_upstream_status,
test_parse and test_show_environment. Left to the full tool (`check-bitbake.sh` with
HOLDFAST_CHECK_LAYER_FULL=1): test_world, the world signature dump of
test_world_inherit_class (its per-recipe checks run in every parse of a build dir that
inherits yocto-check-layer, as check-bitbake.sh's do) and test_signatures.

Usage: check-layer-subset.py <openembedded-core dir> <bitbake dir> <layer dir>
"""

import logging
import os
import sys
import unittest

TESTS = (
    "test_readme",
    "test_security",
    "test_layerseries_compat",
    "test_patches_upstream_status",
    "test_parse",
    "test_show_environment",
)


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.splitlines()[-1], file=sys.stderr)
        return 2
    oe_core, bitbake, layer_dir = (os.path.abspath(a) for a in sys.argv[1:])
    if "BUILDDIR" not in os.environ:
        print("source oe-init-build-env first", file=sys.stderr)
        return 2
    sys.path[0:0] = [
        os.path.join(oe_core, "scripts", "lib"),
        os.path.join(oe_core, "meta", "lib"),
        os.path.join(bitbake, "lib"),
    ]
    from checklayer import LayerType, detect_layers, sanity_check_layers
    from checklayer.cases.common import CommonCheckLayer
    from checklayer.context import CheckLayerTestContext

    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.INFO)
    logger = logging.getLogger("yocto-check-layer")
    layers = detect_layers([layer_dir], True)
    if len(layers) != 1 or not sanity_check_layers(layers, logger):
        print(f"{layer_dir}: not one valid layer ({layers})", file=sys.stderr)
        return 1
    layer = layers[0]
    if layer["type"] in (LayerType.ERROR_NO_LAYER_CONF, LayerType.ERROR_BSP_DISTRO):
        print(f"{layer_dir}: {layer['type']}", file=sys.stderr)
        return 1
    logger.info("%s: %s, %s", layer["name"], layer["type"], layer["path"])
    td = {"builddir": os.environ["BUILDDIR"], "machines": None}
    CommonCheckLayer.td = td
    CommonCheckLayer.tc = CheckLayerTestContext(
        td=td, logger=logger, layer=layer, test_software_layer_signatures=False
    )
    suite = unittest.TestSuite(CommonCheckLayer(name) for name in TESTS)
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
