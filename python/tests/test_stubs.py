"""The checked-in type stubs (python/tutti/_tutti.pyi, installed next to the extension) are what
nanobind's stubgen makes of the installed extension (python/stubgen.py): a binding changed without
regenerating them fails here."""

import importlib.util
import os
import pathlib

import pytest

import tutti

STUBGEN = pathlib.Path(__file__).resolve().parents[1] / "stubgen.py"


def test_checked_in_stubs_match_the_extension():
    pytest.importorskip("nanobind.stubgen")
    spec = importlib.util.spec_from_file_location("tutti_stubgen", STUBGEN)
    stubgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubgen)
    generated = stubgen.generate()
    with open(os.path.join(os.path.dirname(tutti.__file__), "_tutti.pyi")) as f:
        checked_in = f.read()
    assert "class KvStore" in generated and "class TimeoutError(Error, builtins.TimeoutError)" in generated
    assert generated == checked_in, "python/tutti/_tutti.pyi is stale: python python/stubgen.py python/tutti/_tutti.pyi"
