"""Fixtures of the tutti package's tests. They run against the INSTALLED package (scripts/test
installs it into the engine virtual environment first): there is no __init__.py here, so the source
folder python/tutti never shadows it."""

import os
import shutil
import tempfile

import pytest

import tutti


def is_root() -> bool:
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="needs root (loop device and mount)")



@pytest.fixture
def data_dir():
    """A fresh folder on a real file system that takes O_DIRECT (/var/tmp, not a tmpfs /tmp)."""
    path = tempfile.mkdtemp(prefix="tutti-pytest-", dir=os.environ.get("TUTTI_TEST_DIR", "/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_file(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    return path


CUDA_BUILD = tutti.build_info()["accelerator"] == "cuda"


@pytest.fixture(scope="module")
def ext4():
    """A loop-mounted ext4 image (tutti.scratch.ScratchExt4), shared by a module's tests. Every user
    of it runs nvme-soft: host threads drive the soft controller in the host build, GPU threads in the
    CUDA build (docs/python.md, GPU)."""
    if not is_root():
        pytest.skip("needs root (loop device and mount)")
    from tutti.scratch import ScratchExt4

    with ScratchExt4(size_bytes=128 << 20) as fs:
        yield fs


@pytest.fixture
def nvme_soft(ext4):
    """A nvme-soft runtime over the ext4 fixture's image and loop device."""
    with tutti.Runtime("nvme-soft", **ext4.runtime_options()) as rt:
        yield rt
