"""The engine, model shape and data shared by test_lmcache_crash.py and its child (writer_child.py):
128 KiB chunks (16 tokens x 2 layers x 8 KV heads x 128 x fp16 x K,V), four per sequence."""

import torch
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata

LAYERS, HEADS, HEAD_SIZE, CHUNK, CHUNKS_PER_SEQUENCE, SEQUENCES = 2, 8, 128, 16, 4, 400


def config(path: str) -> LMCacheEngineConfig:
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.1, pre_caching_hash_algorithm="sha256_cbor",
        storage_plugins=["tutti"],
        extra_config={"storage_plugin.tutti.module_path": "tutti.lmcache",
                      "storage_plugin.tutti.class_name": "TuttiStorageBackend",
                      "storage_plugin.tutti.path": path,
                      "storage_plugin.tutti.capacity_gb": 0.25})


def metadata() -> LMCacheMetadata:
    return LMCacheMetadata(model_name="tutti-test/crash", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.float16,
                           kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_SIZE), chunk_size=CHUNK)


def tokens(i: int) -> torch.Tensor:
    return torch.randint(0, 32000, (CHUNK * CHUNKS_PER_SEQUENCE,), generator=torch.Generator().manual_seed(i))


def kv(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(50_000 + i)
    return torch.randn(2, LAYERS, CHUNK * CHUNKS_PER_SEQUENCE, HEADS * HEAD_SIZE, generator=g).half()
