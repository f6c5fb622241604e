"""tutti.KvStore: round trips of layer-wise KV blocks between torch tensors (one per layer) and the
store's files, with keys as bytes and wait_layer; over uring on real files and over nvme-soft on a
loop-mounted ext4 image; a damaged block refused (DATA_LOSS), visibility only after commit
(NOT_READY before), namespace mismatch refused naming the field."""

import hashlib
import os

import numpy as np
import pytest
import torch

import tutti

LAYERS, BLOCKS, BLOCK_BYTES = 4, 8, 16 << 10
NAMESPACE = {
    "model": "test-model@rev1", "dtype": "float16", "block_tokens": 16, "layers": LAYERS,
    "piece_bytes": [BLOCK_BYTES], "kv_split": False, "hash_algorithm": "sha256",
}


def keys_for(n, salt=b""):
    return [hashlib.sha256(salt + i.to_bytes(4, "little")).digest() for i in range(n)]


def kv_caches(fill=None):
    """One tensor per layer, shaped like a vLLM layer's cache: (blocks, block bytes / 2) fp16."""
    caches = []
    for layer in range(LAYERS):
        t = tutti.empty((BLOCKS, BLOCK_BYTES // 2), torch.float16)
        if fill is None:
            t.copy_(torch.randn(BLOCKS, BLOCK_BYTES // 2, generator=torch.Generator().manual_seed(layer)))
        else:
            t.fill_(fill)
        caches.append(t)
    return caches


def store_and_load(rt, directory):
    with tutti.KvStore(rt, directory, NAMESPACE, capacity_bytes=LAYERS * 64 * BLOCK_BYTES) as store:
        source = [store.register(t) for t in kv_caches()]
        destination = [store.register(t) for t in kv_caches(fill=0)]
        keys = keys_for(5)
        blocks = [3, 0, 7, 1, 5]  # the engine's block ids of these keys
        assert store.lookup(keys) == 0
        ios = store.store_layers(keys, source, blocks=blocks)
        assert [io.layer for io in ios] == list(range(LAYERS))
        for layer in range(LAYERS):
            [result] = store.wait_layer(layer, timeout_s=30)
            assert result.ok and result.bytes == len(keys) * BLOCK_BYTES and not result.load
        assert store.lookup(keys) == 0  # not visible before commit
        committed = store.commit(keys, timeout_s=30)
        assert [b.status for b in committed] == [tutti.StatusCode.OK] * len(keys)
        assert [b.key for b in committed] == keys
        assert store.lookup(keys) == len(keys)
        assert store.lookup(keys[:2] + keys_for(1, b"other")) == 2  # the stored prefix

        # layer-wise: every layer's load submitted first, then wait layer by layer
        load_blocks = [6, 2, 4, 0, 1]
        store.load_layers(keys, destination, blocks=load_blocks)
        for layer in range(LAYERS):
            [result] = store.wait_layer(layer, timeout_s=30)
            assert result.ok and result.verified_bytes == len(keys) * BLOCK_BYTES
            for k in range(len(keys)):
                assert torch.equal(destination[layer][load_blocks[k]], source[layer][blocks[k]])
        stats = store.statistics()
        assert stats["hits"] == LAYERS * len(keys) and stats["verification_failures"] == 0
        return source


def test_kv_store_round_trip_over_uring(data_dir):
    with tutti.Runtime("uring") as rt:
        store_and_load(rt, os.path.join(data_dir, "kv"))


def test_kv_store_round_trip_over_nvme_soft(ext4, nvme_soft):
    store_and_load(nvme_soft, os.path.join(ext4.mount_point, "kv"))


def test_kv_store_pieces_as_a_list_of_views_and_a_short_last_block(data_dir):
    ns = dict(NAMESPACE, piece_bytes=[8192, 8192], kv_split=True, layers=1)
    with tutti.Runtime("uring") as rt, tutti.KvStore(rt, os.path.join(data_dir, "kv"), ns,
                                                      capacity_bytes=32 * 16384) as store:
        k_cache = store.register(tutti.empty((4, 8192), torch.uint8))
        v_cache = store.register(tutti.empty((4, 8192), torch.uint8))
        k_cache.copy_(torch.randint(0, 255, (4, 8192), dtype=torch.uint8))
        v_cache.copy_(torch.randint(0, 255, (4, 8192), dtype=torch.uint8))
        keys = keys_for(2)
        # key 0: full K and V pieces of block 0; key 1 (the last, shorter block): 100 bytes of block 1
        sources = [k_cache[0], v_cache[0], k_cache[1, :100], v_cache[1, :100]]
        store.wait(store.store(keys, 0, sources), timeout_s=30)
        store.commit(keys)
        out_k = store.register(tutti.empty((4, 8192), torch.uint8))
        out_v = store.register(tutti.empty((4, 8192), torch.uint8))
        out_k.zero_(), out_v.zero_()
        destinations = [out_k[2], out_v[2], out_k[3], out_v[3]]
        result = store.wait(store.load(keys, 0, destinations), timeout_s=30)
        assert result.ok and result.bytes == 2 * 8192 + 2 * 100
        assert torch.equal(out_k[2], k_cache[0]) and torch.equal(out_v[2], v_cache[0])
        assert torch.equal(out_k[3, :100], k_cache[1, :100]) and torch.equal(out_v[3, :100], v_cache[1, :100])


def test_damaged_block_is_refused_never_served(data_dir):
    directory = os.path.join(data_dir, "kv")
    ns = dict(NAMESPACE, layers=1)
    with tutti.Runtime("uring") as rt:
        with tutti.KvStore(rt, directory, ns, capacity_bytes=16 * BLOCK_BYTES) as store:
            cache = store.register(tutti.empty((2, BLOCK_BYTES), torch.uint8))
            cache.copy_(torch.randint(0, 255, (2, BLOCK_BYTES), dtype=torch.uint8))
            keys = keys_for(2)
            store.wait(store.store(keys, 0, cache, blocks=[0, 1]), timeout_s=30)
            store.commit(keys)
        layer_file = os.path.join(directory, "layer-00000.kv")
        with open(layer_file, "r+b") as f:  # flip a byte of one stored block on disk
            data = bytearray(f.read())
            data[data.index(bytes(cache[1, :64].numpy())) + 10] ^= 0xFF
            f.seek(0)
            f.write(data)
        with tutti.KvStore(rt, directory, ns) as store:
            out = store.register(tutti.empty((2, BLOCK_BYTES), torch.uint8))
            out.zero_()
            with pytest.raises(tutti.DataLoss) as caught:
                store.wait(store.load(keys, 0, out, blocks=[0, 1]), timeout_s=30)
            result = caught.value.result
            assert result.blocks[0].ok and not result.blocks[1].ok
            assert result.blocks[1].status == tutti.StatusCode.DATA_LOSS
            assert torch.equal(out[0], cache[0])
            assert store.statistics()["verification_failures"] == 1


def test_commit_of_a_partly_stored_block_is_not_ready_and_stays_invisible(data_dir):
    with tutti.Runtime("uring") as rt, tutti.KvStore(rt, os.path.join(data_dir, "kv"), NAMESPACE,
                                                      capacity_bytes=LAYERS * 16 * BLOCK_BYTES) as store:
        caches = [store.register(t) for t in kv_caches()]
        keys = keys_for(1)
        store.wait(store.store(keys, 0, caches[0], blocks=[0]), timeout_s=30)  # layer 0 of 4 only
        with pytest.raises(tutti.NotReady) as caught:
            store.commit(keys)
        assert caught.value.results[0].status == tutti.StatusCode.NOT_READY
        assert store.lookup(keys) == 0
        with pytest.raises(tutti.NotFound):
            store.wait(store.load(keys, 0, caches[1], blocks=[0]), timeout_s=30)


def test_namespace_mismatch_and_bad_inputs_are_refused(data_dir):
    directory = os.path.join(data_dir, "kv")
    with tutti.Runtime("uring") as rt:
        with tutti.KvStore(rt, directory, NAMESPACE, capacity_bytes=LAYERS * 16 * BLOCK_BYTES) as store:
            cache = store.register(tutti.empty((2, BLOCK_BYTES), torch.uint8))
            with pytest.raises(tutti.InvalidArgument, match="keys\\[0\\] is a str, not bytes"):
                store.lookup(["not bytes"])
            with pytest.raises(tutti.InvalidArgument, match="not inside a region registered"):
                store.store(keys_for(1), 0, [tutti.empty(BLOCK_BYTES, torch.uint8)])
            with pytest.raises(tutti.OutOfRange, match="blocks\\[0\\] = 2"):
                store.store(keys_for(1), 0, cache, blocks=[2])
            with pytest.raises(tutti.InvalidArgument, match="layer"):
                store.store(keys_for(1), LAYERS, cache, blocks=[0])
        with pytest.raises(tutti.InvalidArgument, match="block_tokens"):
            tutti.KvStore(rt, directory, dict(NAMESPACE, block_tokens=32))
        with pytest.raises(tutti.InvalidArgument, match="unknown field 'colour'"):
            tutti.KvStore(rt, directory, dict(NAMESPACE, colour="red"))
    with tutti.Runtime("memfs") as rt, pytest.raises(tutti.Unsupported, match="no files"):
        tutti.KvStore(rt, directory, NAMESPACE)


def test_numpy_arrays_as_kv_sources(data_dir):
    ns = dict(NAMESPACE, layers=1)
    with tutti.Runtime("uring") as rt, tutti.KvStore(rt, os.path.join(data_dir, "kv"), ns,
                                                      capacity_bytes=8 * BLOCK_BYTES) as store:
        source = store.register(tutti.empty((2, BLOCK_BYTES), np.uint8))
        source[:] = np.frombuffer(os.urandom(source.nbytes), np.uint8).reshape(source.shape)
        destination = store.register(tutti.empty((2, BLOCK_BYTES), np.uint8))
        keys = keys_for(2)
        store.wait(store.store(keys, 0, source, blocks=np.array([1, 0])), timeout_s=30)
        store.commit(keys)
        store.wait(store.load(keys, 0, destination, blocks=[0, 1]), timeout_s=30)
        assert np.array_equal(destination[0], source[1]) and np.array_equal(destination[1], source[0])


def test_vllm_layer_views_as_sources_with_block_indices(data_dir):
    """vLLM 0.33 hands the connector one permuted view per layer (LBNHC): blocks= indexes dim 0."""
    heads, tokens, head_size = 2, 16, 128  # page: 16 tokens x 2 heads x (K|V of 128) x fp16 = 16 KiB
    ns = dict(NAMESPACE, layers=2, piece_bytes=[tokens * heads * 2 * head_size * 2])
    with tutti.Runtime("uring") as rt, tutti.KvStore(rt, os.path.join(data_dir, "kv"), ns,
                                                      capacity_bytes=2 * 32 * ns["piece_bytes"][0]) as store:
        def layer_views():
            out = []
            for _ in range(2):
                raw = tutti.empty(BLOCKS * tokens * heads * 2 * head_size, torch.float16)
                raw.copy_(torch.randn(raw.shape))
                out.append(raw.view(BLOCKS, tokens, heads, 2 * head_size).permute(0, 2, 1, 3))
            return out
        sources, destinations = layer_views(), layer_views()
        for t in sources + destinations:
            store.register(t)
        keys = keys_for(3)
        store.store_layers(keys, sources, blocks=[1, 2, 3])
        for layer in range(2):
            store.wait_layer(layer, timeout_s=30)
        store.commit(keys)
        store.load_layers(keys, destinations, blocks=[7, 6, 5])
        for layer in range(2):
            store.wait_layer(layer, timeout_s=30)
            for src, dst in ((1, 7), (2, 6), (3, 5)):
                assert torch.equal(destinations[layer][dst], sources[layer][src])
        with pytest.raises(tutti.InvalidArgument, match="blocks= needs it outermost"):
            store.load(keys[:1], 0, destinations[0].transpose(0, 1), blocks=[0])

