"""The worker side, without vLLM: loads a step's blocks layer by layer into vLLM's KV cache tensors while
compute runs, saves the blocks a step fills, commits them, and reports what finished and what failed.

Runs wherever torch runs (the GPU machine has no vLLM): ``tutti.vllm.TuttiConnector`` wraps it, and
python/tests/vllm_connector/test_gpu_replay.py drives it with CUDA tensors from a recording of vLLM's calls.

Per step (vLLM's order, ``vllm/v1/worker/kv_connector_model_runner_mixin.py``):
``handle_preemptions`` -> ``bind`` -> ``start_load`` -> per layer ``wait_for_layer_load`` and
``save_layer`` -> ``wait_for_save`` -> ``get_finished`` -> ``take_load_errors`` -> ``report``.

Loads: ``start_load`` submits the first ``lookahead_layers`` layers (one store submit per layer, every
block of the step); ``wait_for_layer_load(L)`` submits up to layer L + lookahead and waits for layer L
alone, so layer L computes while the next layers load. A block whose load fails or does not verify is
reported by its vLLM block id (vLLM recomputes it) and evicted from the store, never served.

Saves: ``save_layer(L)`` hands layer L of the step's full blocks to one saver thread (with a CUDA event
fencing the compute that wrote them), which submits the store; after ``wait_for_save`` the thread waits
for every layer and commits the blocks (flush, then the index). A finished request is reported in
``get_finished`` only when all its saves are committed or failed: vLLM frees its blocks then.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
from typing import Any, Iterable, Mapping

import numpy as np
import torch

import tutti

from . import stores
from .config import ConfigError, ConnectorConfig, EngineFacts, PAGE_ALIGNMENT, namespace, validate_engine
from .metadata import BlockTransfer, StepMetadata, WorkerReport

log = logging.getLogger("tutti.kv_connector")

#: The worker's counters (Worker.statistics; docs/vllm.md, "Start-up line and counters"). Units: blocks are
#: KV blocks (every layer of one block counts once), bytes are bytes over all layers, times are seconds of
#: wall time spent waiting for loads (load_wait_s) and in the saver's waits and commits (save_s).
WORKER_COUNTERS = ("loaded_blocks", "load_failures", "load_bytes", "verified_bytes", "load_wait_s",
                   "saved_blocks", "save_failures", "stored_bytes", "save_s")


class _DeviceFence:
    """Orders host-side IO after the GPU work queued so far on the current stream (a no-op on CPU)."""

    def __init__(self, device: torch.device):
        self.event = None
        if device.type == "cuda":
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(device))

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class _SaveGroup:
    """The saves of one step: keys (unique, not in flight elsewhere), their block ids and requests."""

    def __init__(self, step: int, transfers: list[BlockTransfer], skip: set[bytes]):
        self.step = step
        self.requests = sorted({t.req_id for t in transfers})
        self.keys: list[bytes] = []
        self.block_ids: list[int] = []
        self.owner: list[str] = []
        seen = set(skip)
        for t in transfers:
            for key, block in zip(t.keys, t.block_ids):
                if key in seen:
                    continue
                seen.add(key)
                self.keys.append(key)
                self.block_ids.append(block)
                self.owner.append(t.req_id)
        self.queued: set[int] = set()        # layers handed to the saver (forward thread)
        self.submitted: dict[int, Any] = {}  # layer -> KvIo, or None when the store refused it (saver thread)
        self.failed: set[int] = set()        # key indices whose store failed in some layer
        self.tainted: set[int] = set()       # key indices not to commit (source overwritten)
        self.done = False


class Worker:
    """One per tensor-parallel rank. Thread-safety: vLLM's calls come from one thread; the saver thread
    is internal."""

    def __init__(self, config: ConnectorConfig, facts: EngineFacts, *, recorder: "Recorder | None" = None):
        validate_engine(config, facts)
        self.config = config
        self.facts = facts
        self.rank = facts.tp_rank
        self.layers = list(facts.layer_names)
        self.layer_index = {name: i for i, name in enumerate(self.layers)}
        self.directory = config.directory(facts.tp_rank, facts.dp_rank)
        self.namespace = namespace(config, facts)
        self.page = facts.page_bytes
        self.recorder = recorder
        self.store: tutti.KvStore | None = None
        self.device = torch.device("cpu")
        self._region_of: list[torch.Tensor] = []      # per layer
        self._row_base: list[int] = []                # per layer: row of block 0
        self._row_step: list[int] = []                # per layer: rows between consecutive blocks
        self._num_blocks = 0
        # this step
        self._meta: StepMetadata | None = None
        self._load_keys: list[bytes] = []
        self._load_blocks = np.zeros(0, dtype=np.int64)
        self._load_ios: list[Any] = []
        self._load_next = 0
        self._load_waited: set[int] = set()
        self._load_failed: set[int] = set()          # key indices of this step's loads that failed
        self._load_errors: set[int] = set()          # vLLM block ids to report
        self._stale_loads: list[tuple[int, Any]] = []  # (layer, KvIo) timed out, still in flight
        self._group: _SaveGroup | None = None
        # saver thread state (under _cv)
        self._cv = threading.Condition()
        self._queue: queue.Queue = queue.Queue()
        self._groups: collections.deque[_SaveGroup] = collections.deque()
        self._inflight_keys: dict[bytes, _SaveGroup] = {}
        self._pending: dict[str, int] = {}            # req_id -> save groups not finished
        self._save_requests: set[str] = set()         # requests that had saves (vLLM waits for them)
        self._finishing: set[str] = set()             # finished in vLLM, saves still running
        self._committed: list[bytes] = []
        self._stale_stores: list[Any] = []
        self._thread: threading.Thread | None = None
        # Every counter exists from the start (get_kv_connector_stats copies them while the saver counts).
        self.statistics = collections.Counter({name: 0 for name in WORKER_COUNTERS})

    # -- registration --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """Registers vLLM's per-layer KV cache views (one per layer name; shape (num_blocks, ...), one
        page of `page_bytes` per block) and opens this rank's store. Raises ConfigError for a layout it
        cannot serve (a block's page not contiguous, misaligned memory, a missing layer)."""
        missing = [name for name in self.layers if name not in kv_caches]
        if missing:
            raise ConfigError(f"register_kv_caches: no KV cache for layer {missing[0]!r} "
                              f"({len(missing)} of {len(self.layers)} layers missing)")
        on_gpu = [name for name in self.layers if kv_caches[name].device.type == "cuda"]
        accelerator = tutti.build_info()["accelerator"]
        if on_gpu and accelerator != "cuda":
            raise ConfigError(f"register_kv_caches: layer {on_gpu[0]!r} is a CUDA tensor and this tutti is the "
                              f"{accelerator} build, which moves host memory only; install the CUDA build: "
                              "pip install ./python -Csetup-args=-Daccelerator=cuda")
        if self.recorder:
            self.recorder.register(self, kv_caches)
        geometry = [self._geometry(name, kv_caches[name]) for name in self.layers]
        store = stores.open_writer(self.config, self.directory, self.namespace)
        try:
            self._register(store, geometry)
        except BaseException:
            stores.close_writer(self.directory)
            raise
        self.store = store
        self._thread = threading.Thread(target=self._saver, name=f"tutti-saver-{self.rank}", daemon=True)
        self._thread.start()

    def _geometry(self, name: str, t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
        """(layer view, address of block 0, block stride in bytes, blocks) after checking that every block
        of the view is one contiguous page of `page_bytes`."""
        elem = t.element_size()
        if t.dim() < 2:
            raise ConfigError(f"register_kv_caches: layer {name!r} has shape {tuple(t.shape)}; (num_blocks, ...) "
                              "is expected")
        page_elems, span = 1, 1
        for size, stride in zip(t.shape[1:], t.stride()[1:]):
            page_elems *= size
            span += (size - 1) * stride
        if page_elems * elem != self.page or span != page_elems:
            raise ConfigError(f"register_kv_caches: layer {name!r} (shape {tuple(t.shape)}, strides {t.stride()}, "
                              f"{t.dtype}): a block is not one contiguous page of {self.page} bytes; the layout "
                              f"{self.facts.kv_cache_layout} is not supported")
        block_stride = t.stride(0) * elem
        if t.data_ptr() % PAGE_ALIGNMENT or block_stride % self.page:
            raise ConfigError(f"register_kv_caches: layer {name!r}: block 0 at {t.data_ptr():#x} and a block stride "
                              f"of {block_stride} bytes; the address must be a multiple of {PAGE_ALIGNMENT} bytes "
                              f"(O_DIRECT) and the stride a multiple of the page ({self.page} bytes)")
        if self._num_blocks and t.shape[0] != self._num_blocks:
            raise ConfigError(f"register_kv_caches: layer {name!r} has {t.shape[0]} blocks, other layers "
                              f"{self._num_blocks}")
        self._num_blocks = t.shape[0]
        return t, t.data_ptr(), block_stride, t.shape[0]

    def _register(self, store: tutti.KvStore, geometry) -> None:
        """Registers, per allocation, one (rows, page) uint8 view from its first to its last layer's page;
        a layer's block b is row (layer start - region start) / page + b * (block stride / page)."""
        spans: dict[int, list[int]] = {}
        for t, start, stride, blocks in geometry:
            end = start + (blocks - 1) * stride + self.page
            lo_hi = spans.setdefault(t.untyped_storage().data_ptr(), [start, end])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], end)
        regions: dict[int, tuple[torch.Tensor, int]] = {}
        for t, start, stride, blocks in geometry:
            storage = t.untyped_storage()
            base = storage.data_ptr()
            if base not in regions:
                lo, hi = spans[base]
                if (hi - lo) % self.page:
                    raise ConfigError(f"register_kv_caches: the layers of the allocation at {base:#x} are not "
                                      f"page-aligned to each other")
                region = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
                    storage, lo - base, ((hi - lo) // self.page, self.page), (self.page, 1))
                store.register(region)
                regions[base] = (region, lo)
                self.device = t.device
            region, lo = regions[base]
            if (start - lo) % self.page:
                raise ConfigError("register_kv_caches: a layer does not start on a page boundary of its allocation")
            self._region_of.append(region)
            self._row_base.append((start - lo) // self.page)
            self._row_step.append(stride // self.page)

    def describe(self) -> str:
        """The start-up line: store directory, backend, namespace, block bytes and layers."""
        ns = self.namespace
        return (f"tutti: rank {self.rank} KV store {self.directory} (backend {self.config.backend}, capacity "
                f"{self.config.capacity_bytes} bytes); namespace model={ns['model']} dtype={ns['dtype']} "
                f"layout={self.facts.kv_cache_layout} tp={ns['tp_rank']}/{ns['tp_size']} "
                f"block={ns['block_tokens']} tokens hash={ns['hash_algorithm']}; {self.page} bytes per block and "
                f"layer, {len(self.layers)} layers; lookahead {self.config.lookahead_layers} layers, verify loads "
                f"{'on' if self.config.verify_loads else 'OFF'}")

    def rows(self, layer: int, block_ids: Iterable[int] | np.ndarray) -> np.ndarray:
        """Rows of the registered region holding `block_ids` of `layer`."""
        return np.asarray(block_ids, dtype=np.int64) * self._row_step[layer] + self._row_base[layer]

    def page_view(self, layer: int, block_id: int) -> torch.Tensor:
        """The bytes of one block of one layer (a uint8 view of vLLM's cache)."""
        return self._region_of[layer][int(self.rows(layer, [block_id])[0])]

    # -- one step ------------------------------------------------------------------------------

    def handle_preemptions(self, preempted: Iterable[str]) -> None:
        """Before the step's inputs are prepared: the blocks of preempted requests are about to be
        overwritten, so every save still reading them finishes first (or is not committed)."""
        preempted = set(preempted)
        if self.recorder:
            self.recorder.call("handle_preemptions", preempted=sorted(preempted))
        self._drain_stale_loads()
        if not preempted:
            return
        deadline = time.monotonic() + self.config.io_timeout_s
        with self._cv:
            while any(not g.done and preempted.intersection(g.requests) for g in self._groups):
                left = deadline - time.monotonic()
                if left <= 0:
                    for g in self._groups:
                        g.tainted.update(i for i, owner in enumerate(g.owner) if owner in preempted)
                    log.warning("tutti: saves of preempted requests %s still running after io_timeout_s = %s s; "
                                "their blocks will not be committed", sorted(preempted), self.config.io_timeout_s)
                    break
                self._cv.wait(left)

    def bind(self, meta: StepMetadata) -> None:
        """The step's metadata (vLLM's bind_connector_metadata)."""
        if self.recorder:
            self.recorder.call("bind", meta=meta.to_json())
        self._meta = meta
        self._load_keys = [k for t in meta.loads for k in t.keys]
        self._load_blocks = np.asarray([b for t in meta.loads for b in t.block_ids], dtype=np.int64)
        self._load_ios = [None] * len(self.layers)
        self._load_next = 0
        self._load_waited = set()
        self._load_failed = set()
        self._group = None
        if meta.saves:
            with self._cv:
                self._save_requests.update(t.req_id for t in meta.saves)
                group = _SaveGroup(meta.step, meta.saves, set(self._inflight_keys))
                for req in group.requests:
                    self._pending[req] = self._pending.get(req, 0) + 1
                for key in group.keys:
                    self._inflight_keys[key] = group
                self._groups.append(group)
            self._group = group

    def start_load(self) -> None:
        """Submits the loads of the first `lookahead_layers` layers (every block of the step in one
        submit per layer). Waits first for GPU work queued on the stream (vLLM zeroes new blocks there)."""
        if self.recorder:
            self.recorder.call("start_load_kv")
        if not self._load_keys or self._load_next:
            return
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self._submit_loads_until(self.config.lookahead_layers - 1)

    def _submit_loads_until(self, last: int) -> None:
        last = min(last, len(self.layers) - 1)
        while self._load_next <= last:
            layer = self._load_next
            self._load_next += 1
            try:
                self._load_ios[layer] = self.store.load(self._load_keys, layer, self._region_of[layer],
                                                        blocks=self.rows(layer, self._load_blocks))
            except tutti.Error as e:  # nothing submitted for this layer: every block fails
                log.warning("tutti: load of layer %d (%d blocks) refused: %s", layer, len(self._load_keys), e)
                self._load_failed.update(range(len(self._load_keys)))
                self._load_waited.add(layer)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until layer `layer_name`'s blocks of this step are loaded (and verified), after
        submitting the loads of the layers up to `lookahead_layers` beyond it."""
        if self.recorder:
            self.recorder.call("wait_for_layer_load", layer=layer_name)
        layer = self.layer_index.get(layer_name)
        if layer is None or not self._load_keys or layer in self._load_waited:
            return
        if self._load_next == 0 and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self._submit_loads_until(layer + self.config.lookahead_layers)
        self._wait_load(layer)

    def _wait_load(self, layer: int) -> None:
        self._load_waited.add(layer)
        io = self._load_ios[layer]
        if io is None:
            return
        self._load_ios[layer] = None
        started = time.monotonic()
        try:
            result = self.store.wait(io, timeout_s=self.config.io_timeout_s, check=False)
        except tutti.TimeoutError:
            self.statistics["load_wait_s"] += time.monotonic() - started
            log.warning("tutti: load of layer %d not complete after io_timeout_s = %s s; its %d blocks are "
                        "recomputed", layer, self.config.io_timeout_s, len(self._load_keys))
            self._stale_loads.append((layer, io))
            self._load_failed.update(range(len(self._load_keys)))
            return
        self.statistics["load_wait_s"] += time.monotonic() - started
        self.statistics["load_bytes"] += result.bytes
        self.statistics["verified_bytes"] += result.verified_bytes
        for i, block in enumerate(result.blocks):
            if not block.ok:
                if i not in self._load_failed:
                    log.warning("tutti: layer %d of block %d (key %s) not loaded: %s %s", layer,
                                int(self._load_blocks[i]), self._load_keys[i].hex()[:16], block.status.name,
                                block.message)
                self._load_failed.add(i)

    def save_layer(self, layer_name: str) -> None:
        """Hands layer `layer_name` of the step's newly full blocks to the saver (after the compute queued
        so far on the stream, which wrote them)."""
        if self.recorder:
            self.recorder.call("save_kv_layer", layer=layer_name)
        group = self._group
        layer = self.layer_index.get(layer_name)
        if group is None or layer is None or not group.keys or layer in group.queued:
            return
        group.queued.add(layer)
        self._queue.put(("layer", group, layer, _DeviceFence(self.device)))

    def wait_for_save(self) -> None:
        """End of the step's forward: finishes this step's loads (a layer compute never reached is
        waited for here), evicts blocks that failed to load, and closes the step's save group."""
        if self.recorder:
            self.recorder.call("wait_for_save")
        if self._load_keys:
            self._submit_loads_until(len(self.layers) - 1)
            for layer in range(len(self.layers)):
                if layer not in self._load_waited:
                    self._wait_load(layer)
            # Blocks of this step that loaded and verified: one failed block does not void the others.
            self.statistics["loaded_blocks"] += len(self._load_keys) - len(self._load_failed)
            if self._load_failed:
                self._load_errors.update(int(self._load_blocks[i]) for i in self._load_failed)
                self.statistics["load_failures"] += len(self._load_failed)
                bad = sorted({self._load_keys[i] for i in self._load_failed})
                try:
                    self.store.evict(bad)
                except tutti.Error as e:
                    log.warning("tutti: evicting %d blocks that failed to load: %s", len(bad), e)
            self._load_keys = []
        if self._group is not None:
            self._queue.put(("close", self._group, None, _DeviceFence(self.device)))
            self._group = None

    def get_finished(self, finished_req_ids: Iterable[str]) -> tuple[set[str] | None, set[str] | None]:
        """(requests whose saves are all done, None): a request appears once vLLM reported it finished
        (here or in an earlier call) and its saves are committed or failed. Loads are synchronous, so no
        request finishes receiving."""
        finished = set(finished_req_ids)
        with self._cv:
            self._finishing.update(r for r in finished if r in self._save_requests)
            done = {r for r in self._finishing if self._pending.get(r, 0) == 0}
            self._finishing -= done
            for r in done:
                self._save_requests.discard(r)
                self._pending.pop(r, None)
        if self.recorder:
            self.recorder.call("get_finished", finished=sorted(finished), result=sorted(done))
        return (done or None), None

    def take_load_errors(self) -> set[int]:
        """vLLM block ids whose load failed or did not verify since the last call (this step's)."""
        errors, self._load_errors = self._load_errors, set()
        if self.recorder:
            self.recorder.call("get_block_ids_with_load_errors", result=sorted(errors))
        return errors

    def report(self) -> WorkerReport | None:
        """Keys this rank committed since the last report."""
        with self._cv:
            committed, self._committed = self._committed, []
        return WorkerReport({self.rank: committed}) if committed else None

    def idle(self, timeout_s: float) -> bool:
        """Waits until no save is queued or running (tests, shutdown); True when idle."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._groups or not self._queue.empty():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Stops the saver after the queued saves (bounded by io_timeout_s) and closes the store."""
        if self._thread is not None:
            self.idle(self.config.io_timeout_s)
            self._queue.put(None)
            self._thread.join(self.config.io_timeout_s)
            self._thread = None
        if self.store is not None:
            stores.close_writer(self.directory)
            self.store = None
        if self.recorder:
            self.recorder.close()

    # -- internals -----------------------------------------------------------------------------

    def _drain_stale_loads(self) -> None:
        """A load that timed out is still in flight into vLLM's blocks, which vLLM may now recompute
        into: wait once more, and stop the engine rather than let the IO land later."""
        while self._stale_loads:
            layer, io = self._stale_loads[0]
            try:
                self.store.wait(io, timeout_s=self.config.io_timeout_s, check=False)
            except tutti.TimeoutError:
                raise RuntimeError(f"tutti: the load of layer {layer} is still in flight after 2 x io_timeout_s = "
                                   f"{self.config.io_timeout_s} s; its blocks cannot be reused safely") from None
            self._stale_loads.pop(0)

    def _saver(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, group, layer, fence = item
            try:
                if kind == "layer":
                    self._submit_store(group, layer, fence)
                else:
                    if group.keys:
                        for missing in range(len(self.layers)):
                            if missing not in group.submitted:
                                self._submit_store(group, missing, fence)
                    self._finish(group)
            except Exception:  # never let the thread die: the requests would never be reported
                log.exception("tutti: saver failed on step %d", group.step)
                if kind == "close":
                    self._finish(group, failed=True)
            self._drain_stale_stores()

    def _submit_store(self, group: _SaveGroup, layer: int, fence: _DeviceFence) -> None:
        fence.wait()
        try:
            group.submitted[layer] = self.store.store(group.keys, layer, self._region_of[layer],
                                                      blocks=self.rows(layer, group.block_ids))
        except tutti.Error as e:
            log.warning("tutti: store of layer %d (%d blocks) refused: %s", layer, len(group.keys), e)
            group.submitted[layer] = None
            group.failed.update(range(len(group.keys)))

    def _finish(self, group: _SaveGroup, failed: bool = False) -> None:
        """Waits for the group's stores (bounded by io_timeout_s), then commits its blocks in one commit:
        the store makes the fully stored ones visible and drops the failed ones."""
        committed: list[bytes] = []
        started = time.monotonic()
        if group.keys and not failed:
            deadline = time.monotonic() + self.config.io_timeout_s
            late: list[Any] = []
            written = 0
            for layer, io in sorted(group.submitted.items()):
                if io is None:
                    continue
                try:
                    result = self.store.wait(io, timeout_s=max(deadline - time.monotonic(), 0.001), check=False)
                except tutti.TimeoutError:
                    late.append(io)
                    continue
                written += result.bytes
            if late:
                log.warning("tutti: stores of step %d (%d blocks) not complete after io_timeout_s = %s s; not "
                            "committed", group.step, len(group.keys), self.config.io_timeout_s)
                self._stale_stores.append((late, list(group.keys)))
                self.statistics["save_failures"] += len(group.keys)  # never committed
            else:
                self.statistics["stored_bytes"] += written  # counted only for groups that go on to commit
                keep = [k for i, k in enumerate(group.keys) if i not in group.tainted]
                drop = [k for i, k in enumerate(group.keys) if i in group.tainted]
                try:
                    results = self.store.commit(keep, timeout_s=self.config.io_timeout_s, check=False)
                    committed = [r.key for r in results if r.ok]
                    drop += [r.key for r in results if r.status == tutti.StatusCode.NOT_READY]
                    self.statistics["save_failures"] += sum(1 for r in results if not r.ok)
                except tutti.Error as e:
                    log.warning("tutti: commit of %d blocks failed: %s", len(keep), e)
                    drop += keep
                self._discard(drop)
        self.statistics["saved_blocks"] += len(committed)
        self.statistics["save_s"] += time.monotonic() - started
        with self._cv:
            group.done = True
            self._committed.extend(committed)
            for key in group.keys:
                if self._inflight_keys.get(key) is group:
                    del self._inflight_keys[key]
            for req in group.requests:
                self._pending[req] = self._pending.get(req, 1) - 1
            while self._groups and self._groups[0].done:
                self._groups.popleft()
            self._cv.notify_all()

    def _discard(self, keys: list[bytes]) -> None:
        """Drops pending (uncommitted) blocks, so their slots are free again."""
        if keys:
            try:
                self.store.discard(keys)
            except tutti.Error as e:
                log.warning("tutti: discarding %d uncommitted blocks: %s", len(keys), e)

    def _drain_stale_stores(self) -> None:
        """Stores that timed out: once their IO completes, their blocks are discarded."""
        still = []
        for ios, keys in self._stale_stores:
            pending = []
            for io in ios:
                try:
                    self.store.wait(io, timeout_s=0.001, check=False)
                except tutti.TimeoutError:
                    pending.append(io)
                except tutti.Error:
                    pass
            if pending:
                still.append((pending, keys))
            else:
                self._discard(keys)
        self._stale_stores = still


class Recorder:
    """Writes the worker-side calls vLLM made, with their arguments and results, to a JSON file that the
    GPU replay (python/tests/vllm_connector/test_gpu_replay.py) plays back without vLLM."""

    def __init__(self, path: str, extra: dict | None = None):
        self.path = path
        self.data: dict = {"format": "tutti-vllm-calls/1", "extra": extra or {}, "calls": []}

    def register(self, worker: Worker, kv_caches: Mapping[str, torch.Tensor]) -> None:
        first = kv_caches[worker.layers[0]]
        self.data["facts"] = {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in vars(worker.facts).items()}
        self.data["config"] = {"lookahead_layers": worker.config.lookahead_layers,
                               "verify_loads": worker.config.verify_loads,
                               "capacity_bytes": worker.config.capacity_bytes}
        base = min(kv_caches[name].data_ptr() for name in worker.layers)
        end = max(t.data_ptr() + (t.shape[0] - 1) * t.stride(0) * t.element_size() + worker.page
                  for t in (kv_caches[name] for name in worker.layers))
        self.data["kv_caches"] = {"num_blocks": int(first.shape[0]), "dtype": str(first.dtype).replace("torch.", ""),
                                  "shape": list(first.shape), "stride": list(first.stride()),
                                  "layout": worker.facts.kv_cache_layout, "allocation_bytes": end - base,
                                  "byte_offsets": [kv_caches[name].data_ptr() - base for name in worker.layers]}
        self.call("register_kv_caches", layers=list(kv_caches))

    def call(self, name: str, **args) -> None:
        self.data["calls"].append({"call": name, **args})

    def close(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1)
            f.write("\n")
