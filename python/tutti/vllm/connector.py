"""``TuttiConnector``: vLLM's ``KVConnectorBase_V1`` over the Tutti KV block store. This module is glue:
it turns vLLM's objects into plain values and calls ``tutti.kv_connector`` (the scheduler side's and the
worker side's decisions, which do not import vLLM). File:line references are to the vLLM 0.33.0 wheel.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Iterable

import torch
from vllm.distributed.kv_events import MEDIUM_STORAGE, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from tutti.kv_connector.config import (
    ConfigError,
    EngineFacts,
    layer_order,
    parse_config,
    validate_engine,
)
from tutti.kv_connector.metadata import StepMetadata, WorkerReport
from tutti.kv_connector.scheduler import SchedulerSide
from tutti.kv_connector.worker import WORKER_COUNTERS, Recorder, Worker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("tutti.vllm")
# Under vLLM's own "vllm" logger, so the start-up line shows in `vllm serve`'s log with vLLM's format.
startup_log = init_logger("vllm.tutti")

#: Every counter of TuttiConnectorStats: the scheduler side's lookups, then the worker side's
#: (tutti.kv_connector.worker.WORKER_COUNTERS), summed over tensor-parallel ranks.
STATS_COUNTERS = ("lookups", "looked_up_blocks", "hit_blocks") + WORKER_COUNTERS


class TuttiConnectorStats(KVConnectorStats):
    """The connector's counters over one interval, through vLLM's KV connector stats mechanism
    (``vllm/distributed/kv_transfer/kv_connector/v1/metrics.py``): the workers' and the scheduler's
    ``get_kv_connector_stats`` return the counts since their last call; vLLM sums the ranks' and the
    scheduler's with ``aggregate`` and its stats logger prints ``reduce``. ``data`` maps each name of
    ``STATS_COUNTERS`` to a count (blocks, bytes) or seconds (``load_wait_s``, ``save_s``)."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "TuttiConnectorStats":
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        d = {name: self.data.get(name, 0) for name in STATS_COUNTERS}
        out: dict[str, int | float] = {
            "Lookups": d["lookups"], "Blocks looked up": d["looked_up_blocks"], "Blocks hit": d["hit_blocks"],
            "Blocks loaded": d["loaded_blocks"], "Blocks failed to load": d["load_failures"],
            "Blocks saved": d["saved_blocks"], "Blocks failed to save": d["save_failures"],
            "Bytes loaded": d["load_bytes"], "Bytes verified": d["verified_bytes"], "Bytes saved": d["stored_bytes"],
            "Load wait (s)": round(d["load_wait_s"], 6), "Save time (s)": round(d["save_s"], 6),
        }
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class TuttiConnectorMetadata(KVConnectorMetadata):
    """One step's loads, saves and preemptions (``tutti.kv_connector.metadata.StepMetadata``)."""

    def __init__(self, step: StepMetadata):
        self.step = step


class TuttiWorkerMetadata(KVConnectorWorkerMetadata):
    """Keys each rank committed; vLLM folds the ranks' with ``aggregate`` (``kv_connector/utils.py``)."""

    def __init__(self, report: WorkerReport):
        self.report = report

    def aggregate(self, other: KVConnectorWorkerMetadata) -> "TuttiWorkerMetadata":
        assert isinstance(other, TuttiWorkerMetadata)
        return TuttiWorkerMetadata(self.report.merged(other.report))


def tensor_parallel_rank(vllm_config: "VllmConfig") -> int:
    """This worker's tensor-parallel rank: vLLM's process group when it is set up (a real worker), else
    ``parallel_config.rank`` (pipeline parallelism is refused, so the rank is the tensor-parallel one)."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_rank()
    return vllm_config.parallel_config.rank


def engine_facts(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", tp_rank: int) -> EngineFacts:
    """The plain facts ``tutti.kv_connector`` checks and uses, from vLLM's configuration."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise ConfigError("kv_cache_config.kv_cache_groups is empty: the model has no KV cache")
    spec = groups[0].kv_cache_spec
    head_size = getattr(spec, "head_size", 0)
    page = getattr(spec, "real_page_size_bytes", spec.page_size_bytes)
    if spec.page_size_bytes != page:
        raise ConfigError(f"kv_cache_spec.page_size_padded = {spec.page_size_bytes} bytes (page {page} bytes): padded "
                          "pages (hybrid models) are not supported")
    quant = getattr(spec, "kv_quant_mode", None)
    if quant is not None and getattr(quant, "name", "NONE") != "NONE":
        raise ConfigError(f"kv_cache_spec.kv_quant_mode = {quant.name}: quantized caches with scales in the pages "
                          "are not supported")
    cache_config = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    transfer = vllm_config.kv_transfer_config
    model = vllm_config.model_config
    layout = kv_cache_config.kv_cache_layout or cache_config.kv_cache_layout
    if layout is None:
        raise ConfigError("cache_config.kv_cache_layout is not resolved (the engine core resolves it before the "
                          "connectors are built)")
    return EngineFacts(
        model=f"{model.model}@{model.revision or ''}",
        kv_dtype=str(getattr(spec, "dtype", "")).replace("torch.", ""),
        cache_dtype=str(cache_config.cache_dtype),
        block_size=spec.block_size,
        num_kv_heads=getattr(spec, "num_kv_heads", 0),
        head_size=head_size,
        head_size_v=getattr(spec, "head_size_v", None) or head_size,
        page_bytes=page,
        layer_names=tuple(layer_order(groups[0].layer_names)),
        kv_cache_layout=str(layout),
        spec_kind=type(spec).__name__,
        kv_cache_groups=len(groups),
        hash_algorithm=str(cache_config.prefix_caching_hash_algo),
        python_hash_seed=os.environ.get("PYTHONHASHSEED"),
        tp_rank=tp_rank,
        tp_size=parallel.tensor_parallel_size,
        pp_size=parallel.pipeline_parallel_size,
        dcp_size=getattr(parallel, "decode_context_parallel_size", 1),
        pcp_size=getattr(parallel, "prefill_context_parallel_size", 1),
        dp_rank=getattr(parallel, "data_parallel_index", None) or getattr(parallel, "data_parallel_rank", 0) or 0,
        dp_size=parallel.data_parallel_size,
        kv_role=str(transfer.kv_role),
        kv_load_failure_policy=str(transfer.kv_load_failure_policy),
    )


class TuttiConnector(KVConnectorBase_V1):
    """Restores a prefix's KV cache from the Tutti KV block store layer by layer while vLLM computes, and
    saves every full block asynchronously (docs/vllm.md). Loaded with
    ``{"kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm", ...}``."""

    _cache_hit_source = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.config = parse_config(extra)
        rank = 0 if role == KVConnectorRole.SCHEDULER else tensor_parallel_rank(vllm_config)
        self.facts = engine_facts(vllm_config, kv_cache_config, rank)
        validate_engine(self.config, self.facts)
        self._scheduler: SchedulerSide | None = None
        self._worker: Worker | None = None
        if role == KVConnectorRole.SCHEDULER:
            events = vllm_config.kv_events_config is not None and vllm_config.kv_events_config.enable_kv_cache_events
            self._scheduler = SchedulerSide(self.config, self.facts, events=bool(events))
        else:
            recorder = None
            if self.config.record_calls:
                recorder = Recorder(self.config.record_calls.format(rank=rank), {"vllm": _vllm_version()})
            self._worker = Worker(self.config, self.facts, recorder=recorder)
        self._stats_reported: dict[str, float] = {}
        if self._worker is not None:
            startup_log.info("%s", self._worker.describe())
        else:
            startup_log.info("tutti: scheduler looks up %d rank stores at %s (backend %s); %d bytes per block and "
                             "layer, %d layers, %d tokens per block", self.facts.tp_size, self.config.path,
                             self.config.backend, self.facts.page_bytes, len(self.facts.layer_names),
                             self.facts.block_size)

    # -- properties vLLM reads -----------------------------------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a save dropped at preemption is a later miss, not a lost hand-off

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return True  # wait_for_layer_load / save_kv_layer run between layers (base.py:710)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        return None  # any layout whose block of one layer is one page (config.SUPPORTED_LAYOUTS)

    # -- scheduler side ------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        tokens = self._scheduler.matched_tokens(request.request_id, request.block_hashes, request.num_tokens,
                                                num_computed_tokens)
        return tokens, False  # synchronous: loaded layer by layer inside the step's forward

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        (block_ids,) = blocks.get_block_ids()[:1] or ([],)
        self._scheduler.after_alloc(request.request_id, request.block_hashes, lambda: request.all_token_ids,
                                    list(block_ids), num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        scheduled = []
        for new in scheduler_output.scheduled_new_reqs:
            scheduled.append((new.req_id, new.num_computed_tokens, scheduler_output.num_scheduled_tokens[new.req_id],
                              self._block_ids(new.req_id, new.block_ids)))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            scheduled.append((req_id, cached.num_computed_tokens[i], scheduler_output.num_scheduled_tokens[req_id],
                              self._block_ids(req_id, None)))
        preempted = sorted(scheduler_output.preempted_req_ids or ())
        return TuttiConnectorMetadata(self._scheduler.build_step(scheduled, preempted))

    def _block_ids(self, req_id: str, given: tuple[list[int], ...] | None) -> list[int]:
        manager = self._kv_cache_manager  # bound by the scheduler (scheduler.py:384)
        if manager is not None:
            ids = manager.get_block_ids(req_id)
            return list(ids[0]) if ids else []
        return list(given[0]) if given else []

    def update_connector_output(self, connector_output: "KVConnectorOutput"):
        if connector_output.invalid_block_ids:
            self._scheduler.invalid_blocks(set(connector_output.invalid_block_ids))
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TuttiWorkerMetadata):
            self._scheduler.worker_report(meta.report)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict | None]:
        return self._scheduler.finished(request.request_id), None

    def take_events(self) -> Iterable[BlockStored]:
        for block in self._scheduler.take_stored():
            yield BlockStored(block_hashes=[block.key], parent_block_hash=block.parent,
                              token_ids=list(block.token_ids), block_size=self.facts.block_size, lora_id=None,
                              medium=MEDIUM_STORAGE, lora_name=None)

    # -- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._worker.register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        assert isinstance(kv_connector_metadata, TuttiConnectorMetadata)
        self._worker.handle_preemptions(kv_connector_metadata.step.preempted)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        assert isinstance(connector_metadata, TuttiConnectorMetadata)
        self._worker.bind(connector_metadata.step)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        self._worker.start_load()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        self._worker.save_layer(layer_name)

    def wait_for_save(self):
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors()

    def build_connector_worker_meta(self) -> TuttiWorkerMetadata | None:
        report = self._worker.report()
        return TuttiWorkerMetadata(report) if report else None

    # -- counters ------------------------------------------------------------------------------

    def get_kv_connector_stats(self) -> TuttiConnectorStats | None:
        """The counts since the last call (this side's: the scheduler's lookups, or this rank's loads and
        saves); None when nothing happened. vLLM calls it every step on both sides."""
        current = (self._worker.statistics if self._worker is not None else self._scheduler.statistics).copy()
        delta = {name: value - self._stats_reported.get(name, 0) for name, value in current.items()}
        self._stats_reported = dict(current)
        if not any(delta.values()):
            return None
        return TuttiConnectorStats(data=delta)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> TuttiConnectorStats:
        """vLLM's stats logger rebuilds the stats from their ``to_dict()`` payload with this."""
        return TuttiConnectorStats(data=dict(data or {}))

    def statistics(self) -> dict[str, float]:
        """Totals since start-up of this side's counters (names in ``STATS_COUNTERS``)."""
        return dict(self._worker.statistics if self._worker is not None else self._scheduler.statistics)

    def shutdown(self):
        if self._worker is not None:
            self._worker.close()

    @property
    def worker(self) -> Worker | None:
        """The vLLM-free worker logic (tests and the call recording)."""
        return self._worker


def _vllm_version() -> str:
    import vllm

    return vllm.__version__
