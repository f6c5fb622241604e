"""The checked-in type stubs (python/tutti/_tutti.pyi, installed next to the extension) are what
nanobind's stubgen makes of the installed extension (python/stubgen.py): a binding changed without
regenerating them fails here."""

import importlib.util
import os
import pathlib
import re

import pytest

import tutti

STUBGEN = pathlib.Path(__file__).resolve().parents[1] / "stubgen.py"


def pinned_nanobind() -> str:
    """The nanobind version the stubs are generated with: the engine environment's pin."""
    pins = (pathlib.Path(__file__).resolve().parents[2] / "scripts" / "engine-venv").read_text()
    return re.search(r"^nanobind==(\S+)$", pins, re.MULTILINE).group(1)


def test_checked_in_stubs_match_the_extension():
    nanobind = pytest.importorskip("nanobind")
    pytest.importorskip("nanobind.stubgen")
    if nanobind.__version__ != pinned_nanobind():  # another stubgen formats differently
        pytest.skip(f"nanobind {nanobind.__version__}: the stubs are generated with {pinned_nanobind()}")
    spec = importlib.util.spec_from_file_location("tutti_stubgen", STUBGEN)
    stubgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubgen)
    generated = stubgen.generate()
    with open(os.path.join(os.path.dirname(tutti.__file__), "_tutti.pyi")) as f:
        checked_in = f.read()
    assert "class KvStore" in generated and "class TimeoutError(Error, builtins.TimeoutError)" in generated
    assert generated == checked_in, "python/tutti/_tutti.pyi is stale: python python/stubgen.py python/tutti/_tutti.pyi"
