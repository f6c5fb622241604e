"""A fresh virtual environment installs the package from the checkout as a user would: Debian's
python3 -m venv, then `pip install CHECKOUT/python` with build isolation (meson-python, meson and
nanobind from PyPI; python/pyproject.toml forwards to meson-python at the root, so this is also the
build `pip install CHECKOUT` runs), then a round trip through real files in the new environment (no
numpy, no torch there: an anonymous mmap is the page-aligned buffer). Run by scripts/test's
"python fresh venv" stage (TUTTI_TEST_FRESH_VENV=1); it takes minutes, so the main run skips it."""

import os
import pathlib
import subprocess
import sys

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
SMOKE = r"""
import mmap, os, sys, tempfile
import tutti
info = tutti.build_info()
assert info["accelerator"] == "host", info
directory = tempfile.mkdtemp(dir="/var/tmp")
path = os.path.join(directory, "kv.bin")
with open(path, "wb") as f:
    f.write(b"\0" * 8192)
source, destination = mmap.mmap(-1, 8192), mmap.mmap(-1, 8192)
source[:] = os.urandom(8192)
with tutti.Runtime("uring") as rt:
    target = rt.open("file://" + path, writable=True)
    src, dst = rt.register(source), rt.register(destination)
    rt.submit([(tutti.WRITE, src, 0, target, 0, 8192)]).wait(timeout_s=10)
    result = rt.submit([tutti.Request(tutti.READ, dst, 0, target, 0, 8192)]).wait(timeout_s=10)
    assert result.ok and result.confirmed_bytes == 8192
    try:
        rt.submit([(tutti.READ, dst, 0, target, 100, 4096)]).wait(timeout_s=10)
        raise SystemExit("an unaligned offset was accepted")
    except tutti.InvalidArgument as e:
        assert "not a multiple of 4096" in e.message
assert source[:] == destination[:]
os.remove(path); os.rmdir(directory)
print("fresh venv round trip OK", info["version"], tutti.__file__)
"""


@pytest.mark.skipif(os.environ.get("TUTTI_TEST_FRESH_VENV") != "1",
                    reason="minutes long: scripts/test runs it in its own stage (TUTTI_TEST_FRESH_VENV=1)")
def test_a_fresh_venv_installs_the_package_from_the_checkout(tmp_path):
    python = os.environ.get("TUTTI_FRESH_VENV_PYTHON", "/usr/bin/python3")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", str(CHECKOUT / "python")],
                               capture_output=True, text=True)
    sys.stdout.write(installed.stdout[-4000:])
    assert installed.returncode == 0, installed.stderr[-8000:]
    smoke = subprocess.run([str(venv / "bin" / "python"), "-c", SMOKE], capture_output=True, text=True,
                           cwd=str(tmp_path))  # not the checkout: its python/tutti must not be imported
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "fresh venv round trip OK" in smoke.stdout
    assert str(venv) in smoke.stdout  # the package came from the new environment
