"""``TuttiOffloadingSpec``: the Tutti KV block store as a tier of vLLM's native OffloadingConnector,
loaded with ``kv_connector_extra_config: {"spec_name": "TuttiOffloadingSpec", "spec_module_path":
"tutti.vllm", ...}``. Blocks move directly between vLLM's KV cache tensors and storage (no host tier).

Glue only (vLLM 0.33.0, ``vllm/v1/kv_offload/base.py``): the manager looks blocks up in every
tensor-parallel rank's store (a block counts as stored when every rank committed it); the worker is
``tutti.kv_connector.offload.OffloadRunner``, which does not import vLLM.

vLLM 0.33's OffloadingConnector does not handle a failed transfer (``offloading/worker.py`` asserts
``transfer_result.success``): a job that fails is reported as failed, never as done, so vLLM stops;
TuttiConnector is the connector that recomputes failed loads.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Collection, Iterable

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from tutti.kv_connector import stores
from tutti.kv_connector.config import (
    SUPPORTED_LAYOUTS,
    ConfigError,
    ConnectorConfig,
    check_hash_seed,
    hash_seed_identity,
    parse_config,
)
from tutti.kv_connector.offload import OffloadRunner

#: kv_connector_extra_config keys that vLLM's offloading connector reads itself (0.33.0).
log = logging.getLogger(__name__)

VLLM_OFFLOADING_KEYS = ("block_size", "blocks_per_chunk", "canonical_layout", "sync_load_budget_bytes",
                        "self_describing_kv_events", "offload_prompt_only", "hash_algorithm")


class TuttiLoadStoreSpec(LoadStoreSpec):
    """Where blocks live in Tutti: their keys (vLLM's OffloadKeys); picklable."""

    def __init__(self, keys: Iterable[bytes]):
        self.keys = list(keys)

    def __repr__(self) -> str:
        return f"TuttiLoadStoreSpec({len(self.keys)} keys)"


class TuttiOffloadingManager(OffloadingManager):
    """Scheduler side: lookups in every rank's store (read-only), the minimum over ranks.

    Events, only when vLLM publishes KV events (``enable_events``; otherwise vLLM never drains
    ``take_events`` and nothing is recorded): a block is announced stored (``removed=False``) when its
    store completes, and announced removed (``removed=True``) once some rank's store no longer holds it.
    The stores evict on the worker side under their byte bound, so each ``take_events`` call checks the
    ``REMOVAL_CHECKS_PER_CALL`` longest-unchecked announced blocks (one index lookup per rank each): a
    removal is announced within (announced blocks / ``REMOVAL_CHECKS_PER_CALL``) calls of the eviction. At
    most ``ANNOUNCED_LIMIT`` announced blocks are remembered; the oldest beyond it are announced removed
    (a router then misses a block that may still be stored, never the reverse). A lookup that fails (the
    store's directory gone) is logged and retried at the next call; ``take_events`` itself never raises.
    Thread-safety: vLLM calls the manager from its scheduler thread only."""

    REMOVAL_CHECKS_PER_CALL = 256
    ANNOUNCED_LIMIT = 1 << 16

    def __init__(self, config: ConnectorConfig, directories: list[str], namespaces: list[dict],
                 enable_events: bool = False):
        self.config = config
        self.directories = directories
        self.namespaces = namespaces
        self.enable_events = enable_events
        self._storing: set[bytes] = set()
        self._events: list[OffloadingEvent] = []
        self._announced: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # oldest check first

    def _stored(self, key: bytes) -> bool:
        return all(stores.lookup(self.config, d, ns, [key]) == 1 for d, ns in zip(self.directories, self.namespaces))

    def lookup(self, key: bytes, req_context: ReqContext) -> LookupResult:
        if key in self._storing:
            return LookupResult.MISS
        return LookupResult.HIT if self._stored(key) else LookupResult.MISS

    def prepare_load(self, keys: Collection[bytes], req_context: ReqContext) -> LoadStoreSpec:
        return TuttiLoadStoreSpec(keys)

    def prepare_store(self, keys: Collection[bytes], req_context: ReqContext) -> PrepareStoreOutput | None:
        to_store = [k for k in keys if k not in self._storing and not self._stored(k)]
        self._storing.update(to_store)
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=TuttiLoadStoreSpec(to_store), evicted_keys=[])

    def complete_store(self, keys: Collection[bytes], req_context: ReqContext, success: bool = True):
        self._storing.difference_update(keys)
        if success and keys and self.enable_events:
            self._events.append(OffloadingEvent(keys=list(keys), medium=Medium.STORAGE, removed=False))
            for key in keys:
                self._announced[key] = None
                self._announced.move_to_end(key)
            forgotten = []
            while len(self._announced) > self.ANNOUNCED_LIMIT:
                forgotten.append(self._announced.popitem(last=False)[0])
            if forgotten:
                self._events.append(OffloadingEvent(keys=forgotten, medium=Medium.STORAGE, removed=True))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        removed = []
        for _ in range(min(self.REMOVAL_CHECKS_PER_CALL, len(self._announced))):
            key = next(iter(self._announced))
            try:
                stored = self._stored(key)
            except Exception as e:  # noqa: BLE001 - inside vLLM's scheduler step: log, never raise
                log.warning("tutti offloading: checking announced blocks failed (retried next step): %s", e)
                break
            del self._announced[key]
            if stored:
                self._announced[key] = None  # checked again after every other announced block
            else:
                removed.append(key)
        if removed:
            self._events.append(OffloadingEvent(keys=removed, medium=Medium.STORAGE, removed=True))
        events, self._events = self._events, []
        return events


class TuttiOffloadingWorker(OffloadingWorker):
    """Worker side: every job is a store or a load of whole blocks, all layers, on one thread."""

    def __init__(self, runner: OffloadRunner):
        self.runner = runner

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, TuttiLoadStoreSpec)
        return self.runner.submit(job_id, False, dst_spec.keys, _one_per_key(src_spec, dst_spec))

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        assert isinstance(src_spec, TuttiLoadStoreSpec)
        return self.runner.submit(job_id, True, src_spec.keys, _one_per_key(dst_spec, src_spec), expedited)

    def get_finished(self) -> list[TransferResult]:
        return [TransferResult(r.job_id, r.success, r.bytes, r.seconds) for r in self.runner.finished()]

    def wait(self, job_ids: set[int]) -> None:
        self.runner.wait(set(job_ids))

    def shutdown(self) -> None:
        self.runner.close()


def _one_per_key(gpu: GPULoadStoreSpec, tutti_spec: TuttiLoadStoreSpec) -> list[int]:
    block_ids = [int(b) for b in gpu.block_ids]
    if len(block_ids) != len(tutti_spec.keys):
        raise RuntimeError(f"tutti offloading: {len(block_ids)} GPU blocks for {len(tutti_spec.keys)} keys "
                           "(blocks_per_chunk must be 1)")
    return block_ids


class TuttiOffloadingSpec(OffloadingSpec):
    """vLLM's OffloadingSpec over the Tutti KV block store; kv_connector_extra_config takes the keys of
    TuttiConnector that apply (path, capacity_bytes, backend, backend_options, verify_loads,
    io_timeout_s, host_checksum_threads, model_name) plus ``hash_algorithm`` (vLLM's
    --prefix-caching-hash-algo, default sha256: the spec cannot see vLLM's cache config)."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        extra = dict(config.extra_config)
        self.tutti_config = parse_config(extra, allow=VLLM_OFFLOADING_KEYS)
        self.hash_algorithm = extra.get("hash_algorithm", "sha256")
        current = _current_hash_algorithm()
        if current is not None and current != self.hash_algorithm:
            raise ConfigError(f"kv_connector_extra_config.hash_algorithm = {self.hash_algorithm!r} but "
                              f"prefix_caching_hash_algo = {current!r}: they must be equal")
        check_hash_seed(self.hash_algorithm, os.environ.get("PYTHONHASHSEED"))
        parallel = config.parallel
        for name, value in (("pipeline_parallel_size", parallel.pp_size),
                            ("decode_context_parallel_size", parallel.dcp_size),
                            ("prefill_context_parallel_size", parallel.pcp_size)):
            if value != 1:
                raise ConfigError(f"parallel_config.{name} = {value}: not supported by TuttiOffloadingSpec")
        if len(config.groups) != 1:
            raise ConfigError(f"offloading groups = {len(config.groups)}: one KV cache group is supported (no HMA)")
        if config.cache.blocks_per_chunk != 1:
            raise ConfigError(f"kv_connector_extra_config.blocks_per_chunk = {config.cache.blocks_per_chunk}: "
                              "TuttiOffloadingSpec stores vLLM blocks one by one (use 1)")
        if config.canonical_layout:
            raise ConfigError("kv_connector_extra_config.canonical_layout = True: not supported by "
                              "TuttiOffloadingSpec (blocks are stored in the worker's own layout)")
        layout = config.kv_cache_layout or "LBNHC"
        if layout not in SUPPORTED_LAYOUTS:
            raise ConfigError(f"kv_cache_layout = {layout!r}: supported: " + ", ".join(SUPPORTED_LAYOUTS))
        layers = len(config.groups[0].layer_names)
        cross_layer = layout.startswith("B")
        per_block = config.worker_kv_bytes_per_block
        page = per_block if cross_layer else per_block // max(layers, 1)
        if page <= 0 or page % 4096:
            raise ConfigError(f"KV page = {page} bytes (worker_kv_bytes_per_block {per_block}, {layers} layers, "
                              f"layout {layout}): not a multiple of 4096 bytes, the store's O_DIRECT alignment")
        self.layout = layout
        self.directories = [self.tutti_config.directory(r, parallel.data_parallel_index)
                            for r in range(parallel.tp_size)]
        if parallel.tp_size > 1 and "{rank}" not in self.tutti_config.path:
            raise ConfigError(f"kv_connector_extra_config.path = {self.tutti_config.path!r}: tensor_parallel_size = "
                              f"{parallel.tp_size} needs {{rank}} in the path")
        self.namespaces = [{
            "model": self.tutti_config.model_name or config.model.name,
            "dtype": config.model.dtype,
            "tensor_layout": "NHD" if layout.endswith("NHC") else "HND",
            "kv_split": False,
            "cross_layer": cross_layer,
            "tp_rank": r, "tp_size": parallel.tp_size, "pp_stage": 0, "pp_size": 1,
            "block_tokens": config.groups[0].tokens_per_block,
            "layers": 1 if cross_layer else layers,
            "piece_bytes": [page],
            "hash_algorithm": self.hash_algorithm + "+offload-key",
            "hash_seed": hash_seed_identity(self.hash_algorithm, os.environ.get("PYTHONHASHSEED")),
        } for r in range(parallel.tp_size)]
        self._manager: TuttiOffloadingManager | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = TuttiOffloadingManager(self.tutti_config, self.directories, self.namespaces,
                                                   enable_events=self.kv_events_config.enable_kv_cache_events)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        rank = self.config.parallel.rank
        tensors = [t.tensor for t in kv_caches.tensors]
        runner = OffloadRunner(self.tutti_config, self.directories[rank], self.namespaces[rank], tensors)
        return TuttiOffloadingWorker(runner)


def _current_hash_algorithm() -> str | None:
    from vllm.config import get_current_vllm_config_or_none

    current = get_current_vllm_config_or_none()
    if current is None or current.kv_transfer_config is None:
        return None
    return str(current.cache_config.prefix_caching_hash_algo)
