#!/usr/bin/env python3
"""Prints variables of one recipe file, bbappends applied, as `bitbake -e` prints them
(`NAME="value"`), through bitbake's tinfoil: the bbappends are the ones the parse of
the build dir finds (dynamic layers included), which `bitbake -e -b <file>` leaves
out unless the same server has parsed every recipe.

Run in a build dir (oe-init-build-env sourced).
Usage: recipe-env.py <bitbake dir> <recipe file> <variable>...
"""

import os
import sys


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__.splitlines()[-1], file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(os.path.abspath(sys.argv[1]), "lib"))
    import bb.tinfoil

    recipe = os.path.abspath(sys.argv[2])
    with bb.tinfoil.Tinfoil(output=sys.stderr) as tinfoil:
        tinfoil.prepare(config_only=False, quiet=2)
        appends = tinfoil.get_file_appends(recipe)
        print(f"{recipe}: bbappends {list(appends)}", file=sys.stderr)
        d = tinfoil.parse_recipe_file(recipe, appends=True)
        for name in sys.argv[3:]:
            value = (d.getVar(name) or "").replace("\n", " ")
            print(f'{name}="{value}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
