"""PEP 517 hooks for `pip install ./python`: meson-python's own hooks, run at the repository root.

meson-python builds the meson project in the current directory (the frontend runs the hooks in the
directory that holds the pyproject.toml it was given); the package's project is the repository's root
meson.build, one level up. Relative paths in config settings (-Cbuild-dir=...) are then relative
to the repository root. Nothing else differs from `pip install .` at the root.
"""

import os as _os

_os.chdir(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))))

from mesonpy import (  # noqa: E402,F401  (the PEP 517 and PEP 660 hooks)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)
