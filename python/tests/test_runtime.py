"""Round trips of torch CPU tensors and numpy arrays through real files (uring), a loop-mounted
ext4 image (nvme-soft, root) and memfs, and the Runtime's own contract (options, open, shutdown)."""

import os

import numpy as np
import pytest
import torch

import tutti
from conftest import make_file


def round_trip(rt, path_uri, source, destination, block=4096):
    """Writes `source` to the target, reads it back into `destination` in `block`-byte requests."""
    target = rt.open(path_uri, writable=True)
    src = rt.register(source)
    dst = rt.register(destination)
    nbytes = src.size
    writes = [(tutti.WRITE, src, off, target, off, block) for off in range(0, nbytes, block)]
    result = rt.submit(writes).wait(timeout_s=30)
    assert result.ok and result.confirmed_bytes == nbytes
    reads = [tutti.Request(tutti.READ, dst, off, target, off, block) for off in range(0, nbytes, block)]
    result = rt.submit(reads).wait(timeout_s=30)
    assert result.ok and result.confirmed_bytes == nbytes
    assert [r.bytes for r in result.requests] == [block] * (nbytes // block)
    src.unregister()
    dst.unregister()
    target.close()


def test_uring_round_trip_of_torch_cpu_tensors(data_dir):
    path = make_file(os.path.join(data_dir, "kv.bin"), b"\0" * (1 << 20))
    with tutti.Runtime("uring") as rt:
        source = tutti.empty((256, 1024), torch.float16)
        source.copy_(torch.randn(256, 1024, dtype=torch.float16))
        destination = tutti.empty((256, 1024), torch.float16)
        destination.zero_()
        round_trip(rt, "file://" + path, source, destination, block=64 << 10)
        assert torch.equal(source, destination)
    with open(path, "rb") as f:  # the bytes are in the file, not only in a cache of ours
        assert f.read(source.nbytes) == source.view(torch.uint8).numpy().tobytes()


def test_uring_round_trip_of_numpy_arrays(data_dir):
    path = make_file(os.path.join(data_dir, "kv.bin"), b"\0" * (256 << 10))
    rng = np.random.default_rng(7)
    with tutti.Runtime("uring", queue_depth=64) as rt:
        source = tutti.empty(64 << 10, np.float32)
        source[:] = rng.standard_normal(source.shape, dtype=np.float32)
        destination = tutti.empty(64 << 10, np.float32)
        destination[:] = 0
        round_trip(rt, "file://" + path, source, destination)
        assert np.array_equal(source, destination)


def test_uring_reads_a_file_written_by_python(data_dir):
    payload = os.urandom(3 * 4096 + 100)  # an unaligned tail: read whole, reported as its length
    path = make_file(os.path.join(data_dir, "tail.bin"), payload)
    with tutti.Runtime("uring") as rt:
        target = rt.open("file://" + path)
        assert target.size == len(payload)
        buffer = tutti.empty(4 * 4096, np.uint8)
        memory = rt.register(buffer)
        result = rt.submit([(tutti.READ, memory, 0, target, 0, len(payload))]).wait(timeout_s=10)
        assert result.requests[0].bytes == len(payload)
        assert buffer[: len(payload)].tobytes() == payload


def test_memfs_round_trip_of_unaligned_numpy_arrays():
    with tutti.Runtime("memfs") as rt:
        assert rt.alignment == 1
        source = np.arange(1000, dtype=np.int64)
        destination = np.zeros_like(source)
        target = rt.open("memfs://layer-0?size=8000", writable=True)
        src, dst = rt.register(source), rt.register(destination)
        rt.submit([(tutti.WRITE, src, 0, target, 0, 8000)]).wait(timeout_s=5)
        rt.submit([(tutti.READ, dst, 0, target, 0, 8000)]).wait(timeout_s=5)
        assert np.array_equal(source, destination)


def test_nvme_soft_round_trip_on_loop_mounted_ext4(ext4, nvme_soft):
    path = ext4.create_file("layer-0.kv", 1 << 20)
    source = tutti.empty((128, 2048), torch.float32)
    source.copy_(torch.randn(128, 2048))
    destination = tutti.empty((128, 2048), torch.float32)
    destination.zero_()
    round_trip(nvme_soft, "file://" + path, source, destination, block=128 << 10)
    assert torch.equal(source, destination)
    ext4.drop_caches()  # the soft controller wrote the image: the file system reads the same bytes
    with open(path, "rb") as f:
        assert f.read(source.nbytes) == source.view(torch.uint8).numpy().tobytes()


def test_nvme_soft_flush_and_numpy_round_trip(ext4, nvme_soft):
    path = ext4.create_file("layer-1.kv", 256 << 10)
    source = tutti.empty(256 << 10, np.uint8)
    source[:] = np.frombuffer(os.urandom(source.nbytes), np.uint8)
    destination = tutti.empty(256 << 10, np.uint8)
    target = nvme_soft.open("file://" + path, writable=True)
    src, dst = nvme_soft.register(source), nvme_soft.register(destination)
    nvme_soft.submit([(tutti.WRITE, src, 0, target, 0, source.nbytes)]).wait(timeout_s=30)
    flushed = nvme_soft.submit([(tutti.FLUSH, None, 0, target, 0, 0)]).wait(timeout_s=30)
    assert flushed.ok and flushed.requests[0].commands >= 1
    nvme_soft.submit([(tutti.READ, dst, 0, target, 0, source.nbytes)]).wait(timeout_s=30)
    assert np.array_equal(source, destination)


def test_open_batch_returns_one_target_per_uri_and_reports_failures(data_dir):
    paths = [make_file(os.path.join(data_dir, f"l{i}"), b"\0" * 4096) for i in range(4)]
    with tutti.Runtime("uring", open_batch_threads=2) as rt:
        targets = rt.open_batch(["file://" + p for p in paths])
        assert [t.uri for t in targets] == ["file://" + p for p in paths]
        missing = "file://" + os.path.join(data_dir, "missing")
        with pytest.raises(tutti.NotFound) as caught:
            rt.open_batch(["file://" + paths[0], missing])
        results = caught.value.results
        assert isinstance(results[0], tutti.Target) and isinstance(results[1], tutti.NotFound)
        mixed = rt.open_batch([missing, "file://" + paths[1]], check=False)
        assert isinstance(mixed[0], tutti.NotFound) and mixed[1].size == 4096


def test_runtime_options_are_checked():
    with pytest.raises(tutti.InvalidArgument, match="unknown option 'depth'"):
        tutti.Runtime("uring", depth=4)
    with pytest.raises(tutti.InvalidArgument, match="queue_depth = 'x' must be an int"):
        tutti.Runtime("uring", queue_depth="x")
    with pytest.raises(tutti.InvalidArgument, match="backend = 'spdk'"):
        tutti.Runtime("spdk")
    with pytest.raises(tutti.InvalidArgument, match="backing_path"):
        tutti.Runtime("nvme-soft")


def test_context_manager_shuts_down_and_refuses_new_work(data_dir):
    path = make_file(os.path.join(data_dir, "f"), b"\0" * 4096)
    with tutti.Runtime("uring") as rt:
        memory = rt.register(tutti.empty(4096, np.uint8))
    assert "shut down" in repr(rt)
    with pytest.raises(tutti.Busy, match="shutting down"):
        rt.open("file://" + path)
    assert memory.obj is not None


def test_build_info_names_the_profile():
    info = tutti.build_info()
    assert info["accelerator"] in ("host", "cuda")
    assert "uring" in info["backends"] and "memfs" in info["backends"]
    assert info["version"] == tutti.__version__


def test_empty_is_aligned_for_torch_and_numpy():
    for shape in [(1,), (3, 5), (4097,), (2, 3, 4)]:
        t = tutti.empty(shape, torch.bfloat16)
        assert t.data_ptr() % 4096 == 0 and tuple(t.shape) == shape and t.dtype == torch.bfloat16
        assert t.is_contiguous()
        a = tutti.empty(shape, "float64")
        assert a.ctypes.data % 4096 == 0 and a.shape == shape and a.flags.c_contiguous
    with pytest.raises(tutti.InvalidArgument, match="numpy arrays live in pageable CPU memory"):
        tutti.empty(4, np.float32, device="cuda")
    with pytest.raises(tutti.InvalidArgument, match="negative"):
        tutti.empty((2, -1), torch.float32)
