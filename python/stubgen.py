"""Writes the type stubs of the extension, python/tutti/_tutti.pyi, with nanobind's stubgen.

    python python/stubgen.py python/tutti/_tutti.pyi     # with the package installed (pip install .)

Two adjustments to stubgen's output, both for the error classes (tutti.Error and its subclasses are
created with PyErr_NewException, not by nanobind): they are generated as classes of this module
(their __module__ is 'tutti', so stubgen would otherwise import them from the package, which imports
them from here: a cycle with no definition), and tutti.TimeoutError's built-in base is spelled
builtins.TimeoutError (inside the class statement the bare name is the class itself).
python/tests/test_stubs.py runs this and compares with the checked-in file.
"""

import os
import sys

# Run as a script, its folder (python/, holding the source package) comes first on sys.path: drop it,
# so that the installed package, which has the extension, is imported.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

from nanobind.stubgen import StubGen  # noqa: E402

import tutti._tutti as module  # noqa: E402


def generate() -> str:
    errors = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseException)]
    saved = {e: e.__module__ for e in errors}
    try:
        for e in errors:
            e.__module__ = module.__name__
        generator = StubGen(module)
        generator.put(module)
        text = generator.get()
    finally:
        for e, name in saved.items():
            e.__module__ = name
    text = text.replace("class TimeoutError(Error, TimeoutError):", "class TimeoutError(Error, builtins.TimeoutError):")
    if "builtins.TimeoutError" in text and "import builtins" not in text:
        lines = text.split("\n")
        first_import = next(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
        text = "\n".join(lines[:first_import] + ["import builtins"] + lines[first_import:])
    return text


if __name__ == "__main__":
    out = generate()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(out)
    else:
        sys.stdout.write(out)
