"""GPU tests of the CUDA build (python/tests/test_gpu.py; they skip without a GPU or in the host
build): CUDA tensors registered as DEVICE memory and round-tripped through real files (uring);
stream fencing checked without a host wait on the stream (a kernel queued on the stream after the
IO reads the restored bytes; the unfenced control shows the hazard is real); 10 000 KV blocks stored
from and loaded into CUDA tensors, verified; CUDA tensors written and read through nvme-soft (GPU
threads driving the soft controller's queues, root), bytes compared on the GPU and in the image
file, and a KV store over nvme-soft. docs/gpu.md has the commands for the GPU machine."""

import hashlib
import os

import pytest

import tutti

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(tutti.build_info()["accelerator"] != "cuda",
                       reason="host build (CUDA build: -Daccelerator=cuda)"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def random_file(directory, name, nbytes):
    path = os.path.join(directory, name)
    payload = os.urandom(nbytes)
    with open(path, "wb") as f:
        f.write(payload)
        os.fsync(f.fileno())
    return path, payload


@pytest.fixture
def nvme_soft(ext4):
    """Opens a nvme-soft runtime over the module's ext4 image (use as `with nvme_soft() as rt:`): the
    soft controller in accelerator mode, GPU threads submitting and reaping its NVMe commands (root)."""
    return lambda: tutti.Runtime("nvme-soft", **ext4.runtime_options())


def registered_kv_layers(store, blocks, block_bytes, layers, seed):
    """`layers` source tensors of (blocks, block_bytes) random bytes (torch generator `seed`) and as
    many zeroed destination tensors, all CUDA tensors registered with the store; synchronized."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    sources = [store.register(tutti.empty((blocks, block_bytes), torch.uint8, device="cuda")) for _ in range(layers)]
    for t in sources:
        t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, device="cuda", generator=generator))
    destinations = [store.register(tutti.empty((blocks, block_bytes), torch.uint8, device="cuda"))
                    for _ in range(layers)]
    for t in destinations:
        t.zero_()
    torch.cuda.synchronize()
    return sources, destinations


def test_cuda_tensors_register_as_device_memory_and_round_trip(data_dir):
    path, payload = random_file(data_dir, "device.bin", 8 << 20)
    with tutti.Runtime("uring") as rt:
        target = rt.open("file://" + path, writable=True)
        source = tutti.empty(8 << 20, torch.uint8, device="cuda")
        destination = tutti.empty(8 << 20, torch.uint8, device="cuda")
        src, dst = rt.register(source), rt.register(destination)
        assert src.kind == tutti.MemoryKind.DEVICE and src.device == torch.cuda.current_device()
        requests = [(tutti.READ, dst, i << 20, target, i << 20, 1 << 20) for i in range(8)]
        assert rt.submit(requests).wait(timeout_s=30).confirmed_bytes == 8 << 20
        expected = torch.frombuffer(bytearray(payload), dtype=torch.uint8).cuda()
        assert torch.equal(destination, expected)
        source.copy_(torch.flip(expected, [0]))
        torch.cuda.synchronize()  # the source is complete before the WRITE reads it (no fence here)
        assert rt.submit([(tutti.WRITE, src, 0, target, 0, 8 << 20)]).wait(timeout_s=30).ok
    with open(path, "rb") as f:
        written = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    assert torch.equal(written, torch.flip(expected, [0]).cpu())


def sleep_cycles(seconds):
    """torch.cuda._sleep's argument for `seconds`, measured with CUDA events on this GPU (the device's
    clock_rate property reads 0 under CUDA 13, so it cannot be computed from it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 20_000_000
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * seconds * 1e3 / start.elapsed_time(end))


def fenced_read(rt, target, payload, fenced):
    """On stream s: a 200 ms kernel, then a kernel that fills the region with 0xAA; then a READ of the
    file into the region; after wait(), a comparison kernel queued on s. Returns the wrong bytes and
    whether s had finished the sleep and the fill when wait() returned."""
    s = torch.cuda.Stream()
    region = tutti.empty(len(payload), torch.uint8, device="cuda")
    memory = rt.register(region, stream=s if fenced else None)
    expected = torch.frombuffer(bytearray(payload), dtype=torch.uint8).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(sleep_cycles(200e-3))
        region.fill_(0xAA)  # a kernel still "using" the region when the READ is submitted
    rt.submit([(tutti.READ, memory, 0, target, 0, len(payload))]).wait(timeout_s=30)
    earlier_work_done = s.query()  # before anything else is queued on s
    with torch.cuda.stream(s):  # queued on s after wait(): no synchronize of any kind before it
        wrong = (region != expected).sum()
    count = int(wrong.item())  # reading the answer back is the only host wait, after the check ran
    memory.unregister()
    return count, earlier_work_done


def test_stream_fence_orders_the_read_after_earlier_work_and_before_later_kernels(data_dir):
    path, payload = random_file(data_dir, "fence.bin", 4 << 20)
    with tutti.Runtime("uring") as rt:
        target = rt.open("file://" + path)
        wrong, earlier_work_done = fenced_read(rt, target, payload, fenced=True)
        # The READ waited for the 200 ms sleep and the fill queued before it, and the comparison queued
        # after wait() saw the file's bytes.
        assert earlier_work_done
        assert wrong == 0


def test_ten_thousand_kv_blocks_stored_from_and_loaded_into_cuda_tensors(data_dir):
    blocks, block_bytes, layers = 10_000, 16 << 10, 2
    ns = {"model": "gpu-test", "dtype": "uint8", "block_tokens": 16, "layers": layers,
          "piece_bytes": [block_bytes], "kv_split": False, "hash_algorithm": "sha256"}
    keys = [hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(blocks)]
    with tutti.Runtime("uring") as rt, tutti.KvStore(rt, os.path.join(data_dir, "kv"), ns,
                                                      capacity_bytes=layers * (blocks + 16) * block_bytes) as store:
        sources, destinations = registered_kv_layers(store, blocks, block_bytes, layers, seed=1)
        chunk = 2000
        for first in range(0, blocks, chunk):
            ids = list(range(first, first + chunk))
            store.store_layers(keys[first:first + chunk], sources, blocks=ids)
            for layer in range(layers):
                assert all(r.ok for r in store.wait_layer(layer, timeout_s=120))
            assert all(b.ok for b in store.commit(keys[first:first + chunk], timeout_s=120))
        assert store.lookup(keys) == blocks
        reversed_ids = list(range(blocks - 1, -1, -1))  # load block i into row blocks-1-i
        for first in range(0, blocks, chunk):
            store.load_layers(keys[first:first + chunk], destinations, blocks=reversed_ids[first:first + chunk])
            for layer in range(layers):
                results = store.wait_layer(layer, timeout_s=120)
                assert sum(r.verified_bytes for r in results) == chunk * block_bytes
        for layer in range(layers):
            assert torch.equal(destinations[layer], torch.flip(sources[layer], [0]))
        stats = store.statistics()
        assert stats["hits"] == blocks * layers and stats["verification_failures"] == 0


def test_nvme_soft_writes_and_reads_cuda_tensors_through_gpu_driven_queues(ext4, nvme_soft):
    """nvme-soft in the CUDA build: the soft controller in accelerator mode, GPU threads submitting
    and reaping its NVMe commands, CUDA tensors as DEVICE memory. WRITE a random CUDA tensor into a
    file on the ext4 image in 1 MiB commands, READ it back into another CUDA tensor in a different
    order of commands, compare on the GPU; then check the file's bytes as the file system sees them."""
    assert "nvme-soft" in tutti.build_info()["backends"]
    nbytes, piece = 8 << 20, 1 << 20
    path = ext4.create_file("gpu-nvme-soft.bin", nbytes)
    generator = torch.Generator(device="cuda").manual_seed(7)
    with nvme_soft() as rt:
        target = rt.open("file://" + path, writable=True)
        source = tutti.empty(nbytes, torch.uint8, device="cuda")
        destination = tutti.empty(nbytes, torch.uint8, device="cuda")
        source.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=generator))
        destination.fill_(0xAA)
        torch.cuda.synchronize()  # the source is complete before the WRITE reads it
        src, dst = rt.register(source), rt.register(destination)
        assert src.kind == tutti.MemoryKind.DEVICE and dst.kind == tutti.MemoryKind.DEVICE
        writes = [(tutti.WRITE, src, i * piece, target, i * piece, piece) for i in range(nbytes // piece)]
        result = rt.submit(writes).wait(timeout_s=60)
        assert result.ok and result.confirmed_bytes == nbytes
        assert rt.submit([(tutti.FLUSH, None, 0, target, 0, 0)]).wait(timeout_s=60).ok
        reads = [(tutti.READ, dst, i * piece, target, i * piece, piece) for i in reversed(range(nbytes // piece))]
        result = rt.submit(reads).wait(timeout_s=60)
        assert result.ok and result.confirmed_bytes == nbytes
        assert torch.equal(destination, source)
        expected = source.cpu()
    ext4.drop_caches()  # the soft controller wrote the image: the file system reads the same bytes
    with open(path, "rb") as f:
        written = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    assert torch.equal(written, expected)


def test_kv_store_over_nvme_soft_round_trips_cuda_tensors(ext4, nvme_soft):
    """The KV store over a nvme-soft runtime in the CUDA build: blocks stored from CUDA tensors
    (checksummed by the GPU kernels), loaded into other CUDA tensors in reverse row order, every byte
    verified by the store and compared on the GPU."""
    blocks, block_bytes, layers = 256, 64 << 10, 2
    ns = {"model": "gpu-nvme-soft", "dtype": "uint8", "block_tokens": 16, "layers": layers,
          "piece_bytes": [block_bytes], "kv_split": False, "hash_algorithm": "sha256"}
    keys = [hashlib.sha256(b"nvme-soft" + i.to_bytes(4, "little")).digest() for i in range(blocks)]
    with nvme_soft() as rt, tutti.KvStore(
            rt, os.path.join(ext4.mount_point, "kv-gpu"), ns,
            capacity_bytes=layers * (blocks + 16) * block_bytes) as store:
        sources, destinations = registered_kv_layers(store, blocks, block_bytes, layers, seed=3)
        store.store_layers(keys, sources, blocks=list(range(blocks)))
        for layer in range(layers):
            assert all(r.ok for r in store.wait_layer(layer, timeout_s=120))
        assert all(b.ok for b in store.commit(keys, timeout_s=120))
        assert store.lookup(keys) == blocks
        store.load_layers(keys, destinations, blocks=list(range(blocks - 1, -1, -1)))
        for layer in range(layers):
            results = store.wait_layer(layer, timeout_s=120)
            assert sum(r.verified_bytes for r in results) == blocks * block_bytes
        for layer in range(layers):
            assert torch.equal(destinations[layer], torch.flip(sources[layer], [0]))
        assert store.statistics()["verification_failures"] == 0
