"""The LMCache plugin tests' harness: LMCache 0.5.x engines built with LMCache's own configuration objects
(LMCacheEngineConfig, LMCacheMetadata, LMCacheEngineBuilder) on a CPU machine, and the fixtures, which
each test module imports (no conftest.py here: python/tests/conftest.py owns the module name
`conftest`, which the top-level tests import, and a second one would replace it when the whole suite
runs).

LMCache's GPU connectors are CUDA code (lmcache.cuda_ops); on a CPU machine the engine gets
CPUKVConnector below, which copies between LMCache's MemoryObjs and a CPU tensor laid out like
LMCache's KV_2LTD format, [2, layers, tokens, heads x head_size] (a stand-in for vLLM's paged GPU
cache). Everything else is LMCache's own code: token chunking and hashing, StorageManager, the
LocalCPUBackend allocator, the plugin loader."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import sys
import tempfile

import pytest

lmcache = pytest.importorskip("lmcache", reason="the LMCache plugin's tests need lmcache 0.5.x (scripts/engine-venv)")

import torch  # noqa: E402

from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # cpu_connector for the child processes' helper too

from cpu_connector import CPUKVConnector  # noqa: E402

LAYERS, HEADS, HEAD_SIZE, CHUNK = 2, 2, 64, 16  # 16 tokens x 2 x 2 x 128 x fp16 = 16 KiB per chunk
DTYPE = torch.float16
_ids = itertools.count()


def tokens_for(seed: int, n: int) -> torch.Tensor:
    """n token ids of sequence `seed` (distinct sequences have distinct first chunks)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=g)


def kv_for(seed: int, n: int, layers: int = LAYERS, heads: int = HEADS, head_size: int = HEAD_SIZE,
           dtype: torch.dtype = DTYPE) -> torch.Tensor:
    """The KV of sequence `seed`: [2, layers, n, heads x head_size], random but reproducible."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(2, layers, n, heads * head_size, generator=g).to(dtype)


def plugin_extra(folder: str, **settings) -> dict:
    """The plugin's extra_config with the store in `folder`; each setting overrides (None removes it)."""
    extra = {
        "storage_plugin.tutti.module_path": "tutti.lmcache",
        "storage_plugin.tutti.class_name": "TuttiStorageBackend",
        "storage_plugin.tutti.path": folder,
        "storage_plugin.tutti.capacity_gb": 0.01,
    }
    for k, v in settings.items():
        if v is None:
            extra.pop(f"storage_plugin.tutti.{k}", None)
        else:
            extra[f"storage_plugin.tutti.{k}"] = v
    return extra


def make_config(path: str, chunk: int = CHUNK, cpu_gb: float = 0.05, extra: dict | None = None,
                **overrides) -> LMCacheEngineConfig:
    """LMCache's configuration object with the plugin enabled; `overrides` are LMCache settings."""
    settings = dict(
        chunk_size=chunk,
        local_cpu=False,  # LocalCPUBackend stays the allocator and keeps no hot copies
        max_local_cpu_size=cpu_gb,
        pre_caching_hash_algorithm="sha256_cbor",
        save_unfull_chunk=True,
        storage_plugins=["tutti"],
        extra_config=plugin_extra(path) if extra is None else extra,
    )
    settings.update(overrides)
    return LMCacheEngineConfig.from_defaults(**settings)


def make_metadata(chunk: int = CHUNK, layers: int = LAYERS, heads: int = HEADS, head_size: int = HEAD_SIZE,
                  dtype: torch.dtype = DTYPE, model: str = "tutti-test/model", world_size: int = 1,
                  worker_id: int = 0, role: str | None = None) -> LMCacheMetadata:
    return LMCacheMetadata(model_name=model, world_size=world_size, local_world_size=world_size,
                           worker_id=worker_id, local_worker_id=worker_id, kv_dtype=dtype,
                           kv_shape=(layers, 2, chunk, heads, head_size), chunk_size=chunk, role=role)


class Engine:
    """An LMCacheEngine built by LMCacheEngineBuilder with our CPU connector, and its plugin."""

    def __init__(self, config: LMCacheEngineConfig, metadata: LMCacheMetadata):
        self.instance = f"tutti-test-{os.getpid()}-{next(_ids)}"
        self.metadata = metadata
        self.engine = LMCacheEngineBuilder.get_or_create(
            self.instance, config, metadata, CPUKVConnector(metadata),
            broadcast_fn=lambda t, src: None, broadcast_object_fn=lambda o, src: o)
        try:
            self.engine.post_init()
        except BaseException:
            LMCacheEngineBuilder.destroy(self.instance)
            raise
        self.backends = self.engine.storage_manager.storage_backends

    @property
    def plugin(self):
        return self.backends["tutti"]

    def store(self, tokens: torch.Tensor, kv: torch.Tensor, durable: bool = True) -> None:
        self.engine.store(tokens, kvcaches=kv)
        if durable:
            assert self.plugin.flush(timeout_s=120), "puts did not finish"

    def retrieve(self, tokens: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros_like(like)
        mask = self.engine.retrieve(tokens, kvcaches=out)
        return mask, out

    def lookup(self, tokens: torch.Tensor) -> int:
        return self.engine.lookup(tokens)

    def close(self) -> None:
        if self.instance is not None:
            LMCacheEngineBuilder.destroy(self.instance)
            self.instance = None


@pytest.fixture
def store_dir():
    """A fresh folder on a real file system that takes O_DIRECT (/var/tmp, not a tmpfs /tmp)."""
    path = tempfile.mkdtemp(prefix="tutti-lmcache-", dir=os.environ.get("TUTTI_TEST_DIR", "/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def engines():
    """Builds engines (make(config, metadata)) and destroys them after the test."""
    made: list[Engine] = []

    def make(config: LMCacheEngineConfig, metadata: LMCacheMetadata | None = None) -> Engine:
        e = Engine(config, metadata or make_metadata(chunk=config.chunk_size))
        made.append(e)
        return e

    yield make
    for e in reversed(made):
        e.close()


class LogLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@pytest.fixture
def lmcache_log():
    """The records of LMCache's plugin loader and of the plugin (their loggers do not propagate)."""
    handler = LogLines()
    names = ["lmcache.v1.storage_backend", "tutti.lmcache"]
    for n in names:
        logging.getLogger(n).addHandler(handler)
    yield handler.lines
    for n in names:
        logging.getLogger(n).removeHandler(handler)
