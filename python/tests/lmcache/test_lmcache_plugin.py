"""tutti.lmcache.TuttiStorageBackend inside a real LMCache 0.5.x engine (LMCacheEngineBuilder, LMCache's
configuration objects, StorageManager, LocalCPUBackend allocator) on a CPU machine: store then
retrieve through LMCache's API with bytes compared, partial hits, eviction and pins, a damaged chunk
on disk becoming a miss, chunks under the wrong key refused, puts visible only once committed,
objects LMCache's arena cannot hand over directly (staging), chunks larger than one runtime request
with an unfull last chunk, and LMCache's close order (its CPU arena freed only after our puts)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

import tutti
from lmcache_harness import engines, store_dir  # noqa: F401 - fixtures
from lmcache_harness import CHUNK, kv_for, make_config, make_metadata, plugin_extra, tokens_for

from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.utils import CacheEngineKey


def layer_file(path: str) -> str:
    return os.path.join(path, "layer-00000.kv")


def test_store_then_retrieve_through_lmcache(store_dir, engines):
    e = engines(make_config(store_dir))
    assert list(e.backends) == ["LocalCPUBackend", "tutti"]
    tokens = tokens_for(1, 5 * CHUNK + 7)  # five full chunks and an unfull last one (save_unfull_chunk)
    kv = kv_for(1, len(tokens))
    e.store(tokens, kv)
    stats = e.plugin.statistics()
    assert stats["put_chunks"] == 6 and stats["put_failures"] == 0 and stats["staged_chunks"] == 0
    assert stats["store"]["visible_blocks"] == 6
    assert e.lookup(tokens) == len(tokens)

    mask, out = e.retrieve(tokens, kv)
    assert int(mask.sum()) == len(tokens)
    assert torch.equal(out, kv)  # every byte, the unfull last chunk included
    stats = e.plugin.statistics()
    assert stats["get_hits"] == 6 and stats["get_misses"] == 0
    assert stats["store"]["hits"] == 6 and stats["store"]["verified_bytes"] > 0  # read from disk, verified
    assert sorted(os.listdir(store_dir)) == ["index.mdb", "index.mdb-lock", "layer-00000.kv", "writer.lock"]


def test_chunks_survive_a_new_engine_on_the_same_path(store_dir, engines):
    tokens, kv = tokens_for(2, 3 * CHUNK), kv_for(2, 3 * CHUNK)
    first = engines(make_config(store_dir))
    first.store(tokens, kv)
    first.close()  # LMCache's local_disk forgets its files here (its index lives in memory only)
    second = engines(make_config(store_dir))
    assert second.lookup(tokens) == len(tokens)
    mask, out = second.retrieve(tokens, kv)
    assert int(mask.sum()) == len(tokens) and torch.equal(out, kv)


def test_partial_hits(store_dir, engines):
    e = engines(make_config(store_dir))
    tokens, kv = tokens_for(3, 4 * CHUNK), kv_for(3, 4 * CHUNK)
    e.store(tokens, kv)
    # the same first two chunks, then other tokens: a hit of exactly two chunks
    other = torch.cat([tokens[: 2 * CHUNK], tokens_for(99, 2 * CHUNK)])
    assert e.lookup(other) == 2 * CHUNK
    mask, out = e.retrieve(other, kv)
    assert mask.tolist() == [True] * (2 * CHUNK) + [False] * (2 * CHUNK)
    assert torch.equal(out[:, :, : 2 * CHUNK], kv[:, :, : 2 * CHUNK])
    assert not out[:, :, 2 * CHUNK :].any()  # nothing written past the hit
    # a prefix diverging inside the second chunk hits the first chunk only
    diverged = tokens.clone()
    diverged[CHUNK + 3] += 1
    assert e.lookup(diverged) == CHUNK
    mask, _ = e.retrieve(diverged, kv)
    assert int(mask.sum()) == CHUNK
    # a chunk removed through LMCache's API: the prefix stops before it
    key = next(iter(e.engine.token_database.process_tokens(tokens=tokens)))[2]
    assert e.plugin.contains(key)
    assert e.plugin.remove(key)
    assert not e.plugin.contains(key) and e.lookup(tokens) == 0


def test_eviction_keeps_the_capacity_and_spares_pinned_chunks(store_dir, engines):
    chunk_bytes = 2 * 2 * CHUNK * 128 * 2  # [2, layers, tokens, hidden] fp16
    slot = 4096 + chunk_bytes
    capacity = 4 * slot  # room for four chunks
    e = engines(make_config(store_dir, extra=plugin_extra(store_dir, capacity_gb=capacity / 1024**3)))
    seqs = [(tokens_for(100 + i, CHUNK), kv_for(100 + i, CHUNK)) for i in range(7)]
    for tokens, kv in seqs[:4]:
        e.store(tokens, kv)
    assert all(e.lookup(t) == CHUNK for t, _ in seqs[:4])
    # pin sequence 0 the way vLLM's lookup does (lookup with pin=True), then store three more
    assert e.engine.lookup(seqs[0][0], lookup_id="req-0", pin=True) == CHUNK
    for tokens, kv in seqs[4:]:
        e.store(tokens, kv)
    stats = e.plugin.statistics()["store"]
    assert stats["evictions"] >= 3 and stats["visible_blocks"] <= 4
    present = [e.lookup(t) == CHUNK for t, _ in seqs]
    assert present[0], "the pinned chunk was evicted"
    assert sum(present) <= 4 and present[6], present
    for (tokens, kv), here in zip(seqs, present):
        mask, out = e.retrieve(tokens, kv)
        assert int(mask.sum()) == (CHUNK if here else 0)
        if here:
            assert torch.equal(out, kv)
    e.engine.lookup_unpin("req-0")
    for i in range(7, 12):  # unpinned now: it may go like any other
        e.store(tokens_for(100 + i, CHUNK), kv_for(100 + i, CHUNK))
    assert e.lookup(seqs[0][0]) == 0
    assert os.path.getsize(layer_file(store_dir)) == capacity  # the disk use is the capacity, no more


def _damage(path: str, needle: bytes, offset: int) -> None:
    with open(layer_file(path), "r+b") as f:
        data = bytearray(f.read())
        at = data.index(needle)
        data[at + offset] ^= 0xFF
        f.seek(0)
        f.write(data)
        os.fsync(f.fileno())


def test_a_damaged_chunk_on_disk_is_a_miss(store_dir, engines):
    tokens, kv = tokens_for(4, 3 * CHUNK), kv_for(4, 3 * CHUNK)
    e = engines(make_config(store_dir))
    e.store(tokens, kv)
    e.close()
    second_chunk = kv[:, :, CHUNK : 2 * CHUNK].contiguous()
    _damage(store_dir, second_chunk.view(torch.uint8).flatten()[:64].numpy().tobytes(), 100)
    e = engines(make_config(store_dir))
    assert e.lookup(tokens) == len(tokens)  # the index still lists it: only a read can tell
    mask, out = e.retrieve(tokens, kv)
    assert int(mask.sum()) == CHUNK  # the prefix before the damaged chunk; nothing after it
    assert torch.equal(out[:, :, :CHUNK], kv[:, :, :CHUNK])
    assert not out[:, :, CHUNK:].any()
    stats = e.plugin.statistics()
    assert stats["store"]["verification_failures"] == 1 and stats["evicted_damaged"] == 1
    assert e.lookup(tokens) == CHUNK  # evicted: later lookups stop before it


def test_a_damaged_header_is_a_miss(store_dir, engines):
    tokens, kv = tokens_for(5, CHUNK), kv_for(5, CHUNK)
    e = engines(make_config(store_dir))
    e.store(tokens, kv)
    e.close()
    _damage(store_dir, b"TUTTI-LMCACHE-01", 40)
    e = engines(make_config(store_dir))
    mask, out = e.retrieve(tokens, kv)
    assert int(mask.sum()) == 0 and not out.any()


def test_chunks_under_another_key_are_refused_without_checksums(store_dir, engines):
    """With verify_on_load: false the checksums are not read; the header still ties the bytes to the
    key: two valid chunks swapped on disk are both refused."""
    a, b = (tokens_for(6, CHUNK), kv_for(6, CHUNK)), (tokens_for(7, CHUNK), kv_for(7, CHUNK))
    e = engines(make_config(store_dir))
    e.store(*a)
    e.store(*b)
    e.close()
    slot = 4096 + a[1].numel() * 2
    with open(layer_file(store_dir), "r+b") as f:
        data = bytearray(f.read())
        first, second = bytes(data[:slot]), bytes(data[slot : 2 * slot])
        data[:slot], data[slot : 2 * slot] = second, first
        f.seek(0)
        f.write(data)
    e = engines(make_config(store_dir, extra=plugin_extra(store_dir, verify_on_load=False)))
    for tokens, kv in (a, b):
        mask, out = e.retrieve(tokens, kv)
        assert int(mask.sum()) == 0 and not out.any()
    assert e.plugin.statistics()["rejected_chunks"] == 2


def test_a_put_is_visible_only_once_committed(store_dir, engines):
    e = engines(make_config(store_dir))
    gate = threading.Event()
    e.plugin._put_executor.submit(gate.wait, 60)  # holds the put worker: the next batch waits behind it
    tokens, kv = tokens_for(8, 2 * CHUNK), kv_for(8, 2 * CHUNK)
    e.store(tokens, kv, durable=False)
    keys = [k for _, _, k in e.engine.token_database.process_tokens(tokens=tokens)]
    assert all(e.plugin.exists_in_put_tasks(k) for k in keys)
    assert not any(e.plugin.contains(k) for k in keys) and e.lookup(tokens) == 0
    assert e.plugin.statistics()["store"]["visible_blocks"] == 0
    gate.set()
    assert e.plugin.flush(timeout_s=60)
    assert all(e.plugin.contains(k) for k in keys) and not any(e.plugin.exists_in_put_tasks(k) for k in keys)
    mask, out = e.retrieve(tokens, kv)
    assert int(mask.sum()) == len(tokens) and torch.equal(out, kv)


def test_lmcache_frees_its_cpu_arena_only_after_our_puts(store_dir, engines):
    """LMCache 0.5.6 closes LocalCPUBackend (freeing the arena the chunks live in) before plugins."""
    e = engines(make_config(store_dir))
    gate = threading.Event()
    e.plugin._put_executor.submit(gate.wait, 60)
    tokens, kv = tokens_for(9, 3 * CHUNK), kv_for(9, 3 * CHUNK)
    e.store(tokens, kv, durable=False)
    cpu = e.backends["LocalCPUBackend"]
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (cpu.close(), closed.set()))
    closer.start()
    assert not closed.wait(1.0), "LocalCPUBackend freed its arena with our puts in flight"
    gate.set()
    assert closed.wait(60)
    closer.join()
    assert e.plugin.statistics()["put_chunks"] == 3 and e.plugin.statistics()["put_failures"] == 0


def _object(raw: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> TensorMemoryObj:
    meta = MemoryObjMetadata(shape=shape, dtype=dtype, address=0, phy_size=raw.numel(), ref_count=1,
                             pin_count=0, fmt=MemoryFormat.KV_2LTD, shapes=[shape], dtypes=[dtype])
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def test_objects_outside_the_registered_arena_go_through_staging(store_dir, engines):
    e = engines(make_config(store_dir))
    md = e.metadata
    shape = md.get_shapes(CHUNK)[0]
    chunk = kv_for(10, CHUNK).contiguous()
    nbytes = chunk.numel() * 2
    backing = torch.empty(nbytes + 4096 + 64, dtype=torch.uint8)
    skew = (-backing.data_ptr()) % 4096 + 64  # 64 bytes past a 4096 boundary: not O_DIRECT-able
    raw = backing[skew : skew + nbytes]
    raw.view(torch.float16).view(shape).copy_(chunk)
    key = CacheEngineKey(md.model_name, md.world_size, md.worker_id, 0x1234, torch.float16)
    obj = _object(raw, shape, torch.float16)
    e.plugin.batched_submit_put_task([key], [obj])
    assert e.plugin.flush(60) and e.plugin.contains(key)
    assert obj.get_ref_count() == 1  # the plugin's own reference was released
    [got] = e.plugin.batched_get_blocking([key])
    assert got is not None and torch.equal(got.tensor, chunk)
    assert e.plugin.statistics()["staged_chunks"] == 1  # the put; the get read into LMCache's arena
    got.ref_count_down()


def test_chunks_larger_than_one_runtime_request_and_an_unfull_last_chunk(store_dir, engines):
    """An 8448-token chunk of 8 KiB per token is 66 MiB, more than the uring DataPath's 64 MiB per
    request: it is stored as two pieces; the unfull last chunk of 100 tokens fills the first piece
    and stores a padding piece."""
    layers, heads, head_size, chunk = 2, 8, 128, 8448
    md = make_metadata(chunk=chunk, layers=layers, heads=heads, head_size=head_size, dtype=torch.bfloat16)
    cfg = make_config(store_dir, chunk=chunk, cpu_gb=0.4, extra=plugin_extra(store_dir, capacity_gb=0.2))
    e = engines(cfg, md)
    assert e.plugin.layout.pieces == 2
    n = chunk + 100
    tokens = tokens_for(11, n)
    kv = kv_for(11, n, layers, heads, head_size, torch.bfloat16)
    e.store(tokens, kv)
    assert e.plugin.statistics()["put_chunks"] == 2
    mask, out = e.retrieve(tokens, kv)
    assert int(mask.sum()) == n and torch.equal(out, kv)


def test_a_put_from_lmcache_is_one_runtime_submit(store_dir, engines):
    e = engines(make_config(store_dir))
    tokens, kv = tokens_for(12, 8 * CHUNK), kv_for(12, 8 * CHUNK)
    submits = []
    real_store, real_load = e.plugin._store.store, e.plugin._store.load

    class Spy:  # the KvStore binding is a C++ class: wrap it to count its store/load calls
        def __init__(self, store):
            self._s = store

        def __getattr__(self, name):
            return getattr(self._s, name)

        def store(self, keys, layer, pieces, blocks=None):
            submits.append(("store", len(keys), len(pieces)))
            return real_store(keys, layer, pieces)

        def load(self, keys, layer, pieces, blocks=None):
            submits.append(("load", len(keys), len(pieces)))
            return real_load(keys, layer, pieces)

    e.plugin._store = Spy(e.plugin._store)
    e.store(tokens, kv)
    e.retrieve(tokens, kv)
    assert submits == [("store", 8, 16), ("load", 8, 16)]  # each chunk: header + data piece
    stats = e.plugin.statistics()["store"]
    assert stats["resubmits"] == 0  # the runtime took every request of each batch at once



def test_a_batch_deeper_than_the_runtime_queue(store_dir, engines):
    """queue_depth 64 and 16 chunks of 8 MiB (8 commands of 1 MiB each, plus a 4 KiB header), the
    proportions of an 8B model's 16-chunk batch at the default depth (32 MiB chunks, 256 slots): the
    runtime takes some requests of the batch and refuses others (RESOURCE_EXHAUSTED), not only a
    tail. The store submits the refused ones as the first complete (resubmits) and matches each
    completion to its position in the submit; every chunk comes back with its bytes. Before that
    match was fixed (include/tutti/kv/store.hpp, submit_some), this test crashed the process with a
    segmentation fault in KvStore::drive (checked)."""
    layers, heads, head_size, chunk = 2, 8, 128, 1024  # 8 MiB per chunk
    md = make_metadata(chunk=chunk, layers=layers, heads=heads, head_size=head_size)
    extra = plugin_extra(store_dir, capacity_gb=0.2, queue_depth=64)
    e = engines(make_config(store_dir, chunk=chunk, cpu_gb=0.4, extra=extra), md)
    n = 16 * chunk
    tokens, kv = tokens_for(13, n), kv_for(13, n, layers, heads, head_size)
    e.store(tokens, kv)
    assert e.plugin.statistics()["put_chunks"] == 16 and e.plugin.statistics()["put_failures"] == 0
    mask, out = e.retrieve(tokens, kv)
    assert int(mask.sum()) == n and torch.equal(out, kv)
    assert e.plugin.statistics()["store"]["resubmits"] > 0  # the backpressure path ran
