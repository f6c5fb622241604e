"""A CPU harness around vLLM 0.33.0's real Scheduler, KVConnectorFactory and KVOutputAggregator, with
CPU KV cache tensors built by vLLM's own create_kv_cache_views (the layout the engine allocates), and a
stand-in for the model runner that calls the worker-side connectors in vLLM's order.

Built after vLLM's tests/v1/kv_connector/unit/utils.py (read in vllm-project/vllm; the wheel ships no
tests): ModelConfig from a local folder holding only config.json (no network), SchedulerConfig,
CacheConfig, KVTransferConfig, DeviceConfig("cpu"), a KVCacheConfig of one group, Requests hashed with
get_request_block_hasher after init_none_hash, ModelRunnerOutputs built by hand.

What vLLM cannot run on this machine, and what stands in for it:
- the model forward (GPUModelRunner needs CUDA and vLLM's compiled ops, vllm._C, which the CPU import
  lacks): `Engine.step` calls the worker connector in the order of
  vllm/v1/worker/kv_connector_model_runner_mixin.py:64-112 and gpu_model_runner.py:3934-3937
  (handle_preemptions, bind_connector_metadata, start_load_kv before the forward when the step has sync
  loads, per attention layer wait_for_layer_load then save_kv_layer as
  vllm/model_executor/layers/attention/kv_transfer_utils.py:47-57 does, wait_for_save,
  get_transfer_results, get_block_ids_with_load_errors, build_connector_worker_meta,
  clear_connector_metadata), and "computes" each layer by writing a known pattern into the pages of the
  blocks the step fills (pattern(block hash, layer, rank)), so restored bytes can be compared;
- the tensor-parallel executor (one process per rank, NCCL): each rank's worker connector is built by
  KVConnectorFactory in this process with its own parallel_config.rank, and their outputs are folded by
  vLLM's KVOutputAggregator exactly as the multiprocess executor folds them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time

import torch

import tutti
from kv_pages import damage, page_of, pattern, write_page  # noqa: F401 (re-exported)

from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig)
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor,
                                        create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

EOS = 2
SAMPLED = 7  # the token every "model" step samples


def model_dir(root: str, layers: int, kv_heads: int, head_size: int) -> str:
    """A local model folder holding only a Llama config.json (vLLM reads nothing else here)."""
    path = os.path.join(root, "model")
    os.makedirs(path, exist_ok=True)
    heads = max(kv_heads, 2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": heads * head_size,
                   "intermediate_size": 256, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                   "head_dim": head_size, "num_hidden_layers": layers, "vocab_size": 1000,
                   "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}, f)
    return path


@dataclasses.dataclass
class Shape:
    layers: int = 3
    kv_heads: int = 2          # per rank
    head_size: int = 64
    block_size: int = 16
    num_blocks: int = 64
    dtype: torch.dtype = torch.float16

    @property
    def spec(self) -> FullAttentionSpec:
        return FullAttentionSpec(block_size=self.block_size, num_kv_heads=self.kv_heads, head_size=self.head_size,
                                 dtype=self.dtype)

    @property
    def layer_names(self) -> list[str]:
        return [f"model.layers.{i}.self_attn.attn" for i in range(self.layers)]


def vllm_config(root: str, extra: dict, shape: Shape = Shape(), *, tp: int = 1, policy: str = "recompute",
                hash_algo: str = "sha256", layout: str = "LBNHC", kv_role: str = "kv_both",
                connector: str = "TuttiConnector", module: str | None = "tutti.vllm",
                events: bool = False) -> VllmConfig:
    model = ModelConfig(model=model_dir(root, shape.layers, shape.kv_heads * tp, shape.head_size),
                        skip_tokenizer_init=True, dtype="float16", max_model_len=2048, seed=0)
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048,
                                         is_encoder_decoder=model.is_encoder_decoder),
        cache_config=CacheConfig(block_size=shape.block_size, enable_prefix_caching=True,
                                 prefix_caching_hash_algo=hash_algo),
        kv_transfer_config=KVTransferConfig(kv_connector=connector, kv_connector_module_path=module,
                                            kv_role=kv_role, kv_load_failure_policy=policy,
                                            kv_connector_extra_config=extra),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null") if events else None,
        device_config=DeviceConfig("cpu"))
    config.cache_config.kv_cache_layout = layout  # resolved, as the engine core does before connectors exist
    if tp != 1:
        # The CPU build of ParallelConfig cannot be constructed for several ranks (no devices); the
        # connector reads only these fields.
        object.__setattr__(config.parallel_config, "tensor_parallel_size", tp)
        object.__setattr__(config.parallel_config, "world_size", tp)
    return config


def kv_cache_config(shape: Shape) -> KVCacheConfig:
    page = shape.spec.page_size_bytes
    return KVCacheConfig(
        num_blocks=shape.num_blocks,
        kv_cache_tensors=[KVCacheTensor(size=page * shape.num_blocks * shape.layers, layers=shape.layer_names,
                                        layer_stride=page * shape.num_blocks, block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(shape.layer_names, shape.spec)])


def kv_caches(shape: Shape, layout: str = "LBNHC") -> dict[str, torch.Tensor]:
    """vLLM's per-layer views over one allocation (create_kv_cache_views, vllm/v1/kv_cache_interface.py),
    4096-byte aligned as the CUDA allocator aligns vLLM's KV allocation."""
    page = shape.spec.page_size_bytes
    size = page * shape.num_blocks * shape.layers
    raw = tutti.empty(size, torch.int8)
    raw.zero_()
    cross = layout.startswith("B")
    tensor = KVCacheTensor(size=size, layers=shape.layer_names,
                           layer_stride=page if cross else page * shape.num_blocks,
                           block_stride=page * shape.layers if cross else page)
    views = create_kv_cache_views(raw, shape.spec, shape.num_blocks, KVCacheLayout[layout], tensor)
    return dict(zip(shape.layer_names, views))


class Engine:
    """vLLM's Scheduler with the Tutti connector on the scheduler side, and one worker-side connector per
    tensor-parallel rank with CPU KV caches, stepped like the engine core and its executor."""

    def __init__(self, root: str, extra: dict, shape: Shape = Shape(), *, tp: int = 1, layout: str = "LBNHC",
                 **config_args):
        self.shape = shape
        self.tp = tp
        self.config = vllm_config(root, extra, shape, tp=tp, layout=layout, **config_args)
        self.kv_config = kv_cache_config(shape)
        self.config.cache_config.num_gpu_blocks = shape.num_blocks
        algo = self.config.cache_config.prefix_caching_hash_algo
        self.hash_fn = get_hash_fn_by_name(algo)
        init_none_hash(self.hash_fn)  # the engine core does this (vllm/v1/engine/core.py:219-230)
        # workers first, as in the engine (the executor allocates and registers KV caches before the
        # scheduler is built)
        self.workers = []
        self.caches = []
        for rank in range(tp):
            cfg = copy.deepcopy(self.config) if tp > 1 else self.config
            if tp > 1:
                object.__setattr__(cfg.parallel_config, "rank", rank)
            worker = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, self.kv_config)
            caches = kv_caches(shape, layout)
            worker.register_kv_caches(caches)
            self.workers.append(worker)
            self.caches.append(caches)
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=self.kv_config,
                                   structured_output_manager=StructuredOutputManager(self.config),
                                   block_size=shape.block_size, log_stats=True)
        self.connector = self.scheduler.connector
        # the scheduler drains the connector's take_events() every step into its publisher: keep what it publishes
        self.scheduler.kv_event_publisher.publish = lambda batch: self.events.extend(batch.events)
        self.aggregator = KVOutputAggregator(expected_finished_count=tp)
        self.page_bytes = shape.spec.page_size_bytes
        self.outputs: dict[str, list[int]] = {}
        self.scheduled: list[dict[str, int]] = []
        self.load_errors: list[set[int]] = []
        self.finished_sending: list[set[str]] = []
        self.events = []
        self.connector_stats: list[dict] = []  # SchedulerStats.kv_connector_stats of every step that had some
        self.before_layer = None  # test hook: called with (rank, layer index) before wait_for_layer_load
        self.after_schedule = None  # test hook: called with the SchedulerOutput before the workers run

    def make_request(self, req_id: str, prompt: list[int], max_tokens: int = 2) -> Request:
        """A vLLM Request with its block hashes, not added to the scheduler."""
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, EOS)
        return Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp, pooling_params=None,
                       block_hasher=get_request_block_hasher(self.shape.block_size, self.hash_fn))

    def request(self, req_id: str, prompt: list[int], max_tokens: int = 2) -> Request:
        req = self.make_request(req_id, prompt, max_tokens)
        self.scheduler.add_request(req)
        return req

    def step(self):
        out = self.scheduler.schedule()
        self.scheduled.append(dict(out.num_scheduled_tokens))
        if self.after_schedule:
            self.after_schedule(out)
        meta = out.kv_connector_metadata
        rank_outputs = []
        for rank, worker in enumerate(self.workers):
            worker.handle_preemptions(meta)
            worker.bind_connector_metadata(meta)
            if out.has_sync_kv_loads:
                worker.start_load_kv(None)
            if out.total_num_scheduled_tokens:
                for layer, name in enumerate(self.shape.layer_names):
                    if self.before_layer:
                        self.before_layer(rank, layer)
                    worker.wait_for_layer_load(name)
                    self._compute(out, rank, layer)
                    worker.save_kv_layer(name, self.caches[rank][name], None)
            else:
                worker.start_load_kv(None)
            worker.wait_for_save()
            results = worker.get_transfer_results(out.finished_req_ids)
            kv_out = KVConnectorOutput(finished_sending=results.finished_sending or None,
                                       finished_recving=results.finished_recving or None,
                                       failed_recving=results.failed_recving,
                                       invalid_block_ids=worker.get_block_ids_with_load_errors(),
                                       kv_connector_worker_meta=worker.build_connector_worker_meta(),
                                       kv_connector_stats=worker.get_kv_connector_stats())
            worker.clear_connector_metadata()
            req_ids = list(out.num_scheduled_tokens)
            rank_outputs.append(ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[[SAMPLED] for _ in req_ids], logprobs=None, prompt_logprobs_dict={},
                pooler_output=None, kv_connector_output=kv_out))
        merged = self.aggregator.aggregate(rank_outputs)
        self.load_errors.append(set(merged.kv_connector_output.invalid_block_ids))
        self.finished_sending.append(set(merged.kv_connector_output.finished_sending or ()))
        for eco in self.scheduler.update_from_output(out, merged).values():
            stats = eco.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                self.connector_stats.append(stats.kv_connector_stats)  # what vLLM's stats loggers receive
        return out

    def _compute(self, out, rank: int, layer: int) -> None:
        """The stand-in model: writes pattern(hash, layer, rank) into every block page this step touches."""
        view = self.caches[rank][self.shape.layer_names[layer]]
        bs = self.shape.block_size
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[req_id]
            computed = req.num_computed_tokens  # before the step: the scheduler advances it after the forward
            computed -= n  # _update_after_schedule already added the step's tokens
            (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(req_id)
            for index in range(computed // bs, (computed + n - 1) // bs + 1):
                key = req.block_hashes[index] if index < len(req.block_hashes) else b"partial:" + req_id.encode()
                write_page(view, block_ids[index], pattern(key, layer, rank, self.page_bytes))

    def run(self, max_steps: int = 200, timeout_s: float = 60.0) -> int:
        """Steps until every request finished and its blocks were released (saves durable)."""
        deadline = time.monotonic() + timeout_s
        steps = 0
        while self.scheduler.requests or self.scheduler.has_unfinished_requests():
            assert steps < max_steps and time.monotonic() < deadline, (
                f"not done after {steps} steps: {list(self.scheduler.requests)}")
            self.step()
            steps += 1
            if not self.scheduler.get_num_unfinished_requests():
                time.sleep(0.005)  # the savers commit in the background
        return steps

    def check_blocks(self, req: Request, upto_tokens: int | None = None) -> int:
        """Compares every full block of `req` in every layer and rank with what the model wrote for its
        hash; returns the number of pages compared."""
        (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)
        n = (upto_tokens if upto_tokens is not None else req.num_computed_tokens) // self.shape.block_size
        compared = 0
        for rank in range(self.tp):
            for layer, name in enumerate(self.shape.layer_names):
                view = self.caches[rank][name]
                for index in range(n):
                    expected = pattern(req.block_hashes[index], layer, rank, self.page_bytes)
                    got = page_of(view, block_ids[index])
                    assert torch.equal(got, expected), (
                        f"rank {rank} layer {layer} block {index} (id {block_ids[index]}) differs")
                    compared += 1
        return compared

    def store(self, rank: int = 0):
        """The writer store of a rank (the worker side's tutti.KvStore)."""
        return self.workers[rank].worker.store

    def scramble(self) -> None:
        """Overwrites every KV cache byte (what a reused GPU block would hold), so that matching bytes
        after a step can only have come from a load or from the step's own compute."""
        for caches in self.caches:
            storage = next(iter(caches.values())).untyped_storage()
            torch.empty(0, dtype=torch.uint8).set_(storage).fill_(0xA5)

    def close(self):
        for worker in self.workers:
            worker.shutdown()
        from tutti.kv_connector import stores
        stores.close_all()
