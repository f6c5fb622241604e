"""The worker of the native offloading adapter (``tutti.vllm.TuttiOffloadingSpec``), without vLLM: moves
whole blocks between vLLM's KV cache tensors and this rank's store, one job at a time on one thread.

vLLM's OffloadingConnector hands each job over as (GPU block ids, our keys); a job stores or loads every
"layer" of the canonical view it gave us (one int8 tensor of shape (num_blocks, page) per layer, or one
tensor for a cross-layer allocation), then commits (stores). Results are (job_id, success, bytes, seconds):
success is False for a job any of whose blocks failed, and a load that fails is never reported good.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Sequence

import numpy as np
import torch

import tutti

from . import stores
from .config import PAGE_ALIGNMENT, ConfigError, ConnectorConfig

log = logging.getLogger("tutti.kv_connector")


@dataclasses.dataclass
class JobResult:
    job_id: int
    success: bool
    bytes: int
    seconds: float


class OffloadRunner:
    """Stores and loads whole blocks for vLLM's offloading worker; ``submit_*`` never block."""

    def __init__(self, config: ConnectorConfig, directory: str, name_space: dict, tensors: Sequence[torch.Tensor]):
        self.config = config
        self.directory = directory
        self.page = name_space["piece_bytes"][0]
        if len(tensors) != name_space["layers"]:
            raise ConfigError(f"offloading: vLLM gave {len(tensors)} KV cache tensors; the namespace has "
                              f"{name_space['layers']} layers")
        self.store = stores.open_writer(config, directory, name_space)
        self.device = tensors[0].device
        self._regions: list[torch.Tensor] = []
        self._row_base: list[int] = []
        self._row_step: list[int] = []
        try:
            # One registration per allocation, from its first tensor's first page to its last tensor's last
            # page (vLLM's allocation may start before an aligned view of it, as tutti.empty's does).
            spans: dict[int, list[int]] = {}
            for i, t in enumerate(tensors):
                whole_pages = t.dim() == 2 and (t.stride(0) * t.element_size()) % self.page == 0
                if t.dim() != 2 or t.shape[1] != self.page or t.stride(1) != 1 or not whole_pages:
                    raise ConfigError(f"offloading: KV cache tensor {i} has shape {tuple(t.shape)} and strides "
                                      f"{t.stride()}; (num_blocks, {self.page}) with whole pages per block is needed")
                if t.data_ptr() % PAGE_ALIGNMENT:
                    raise ConfigError(f"offloading: KV cache tensor {i} starts at {t.data_ptr():#x}, not on a multiple "
                                      f"of {PAGE_ALIGNMENT} bytes (O_DIRECT)")
                end = t.data_ptr() + (t.shape[0] - 1) * t.stride(0) * t.element_size() + self.page
                span = spans.setdefault(t.untyped_storage().data_ptr(), [t.data_ptr(), end])
                span[0], span[1] = min(span[0], t.data_ptr()), max(span[1], end)
            registered: dict[int, tuple[torch.Tensor, int]] = {}
            for i, t in enumerate(tensors):
                storage = t.untyped_storage()
                base = storage.data_ptr()
                if base not in registered:
                    lo, hi = spans[base]
                    if (hi - lo) % self.page or any((u.data_ptr() - lo) % self.page for u in tensors
                                                    if u.untyped_storage().data_ptr() == base):
                        raise ConfigError("offloading: the KV cache tensors of one allocation are not whole pages "
                                          "apart")
                    region = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
                        storage, lo - base, ((hi - lo) // self.page, self.page), (self.page, 1))
                    self.store.register(region)
                    registered[base] = (region, lo)
                region, lo = registered[base]
                self._regions.append(region)
                self._row_base.append((t.data_ptr() - lo) // self.page)
                self._row_step.append(t.stride(0) * t.element_size() // self.page)
        except BaseException:
            stores.close_writer(directory)
            raise
        self._cv = threading.Condition()
        self._jobs: collections.deque = collections.deque()
        self._results: dict[int, JobResult] = {}
        self._unreported: list[int] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tutti-offload", daemon=True)
        self._thread.start()

    def submit(self, job_id: int, load: bool, keys: Sequence[bytes], block_ids: Sequence[int],
               expedited: bool = False) -> bool:
        """Queues a job; an expedited one (a load the step waits for) goes first."""
        fence = None
        if not load and self.device.type == "cuda":
            fence = torch.cuda.Event()
            fence.record(torch.cuda.current_stream(self.device))
        job = (job_id, load, list(keys), np.asarray(block_ids, dtype=np.int64), fence)
        with self._cv:
            if self._closed:
                return False
            (self._jobs.appendleft if expedited else self._jobs.append)(job)
            self._cv.notify_all()
        return True

    def finished(self) -> list[JobResult]:
        with self._cv:
            out = [self._results.pop(j) for j in self._unreported]
            self._unreported = []
        return out

    def wait(self, job_ids: set[int]) -> None:
        """Blocks until the jobs ran (their results stay for ``finished``); bounded by io_timeout_s per job."""
        deadline = time.monotonic() + self.config.io_timeout_s * max(1, len(job_ids))
        with self._cv:
            while not all(j in self._results for j in job_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"tutti offloading: jobs {sorted(job_ids)} not done after "
                                       f"{self.config.io_timeout_s * max(1, len(job_ids))} s")
                self._cv.wait(left)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(self.config.io_timeout_s)
        stores.close_writer(self.directory)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            job_id, load, keys, blocks, fence = job
            start = time.monotonic()
            try:
                ok, nbytes = self._load(keys, blocks) if load else self._store(keys, blocks, fence)
            except Exception:
                log.exception("tutti offloading: job %d failed", job_id)
                ok, nbytes = False, 0
            with self._cv:
                self._results[job_id] = JobResult(job_id, ok, nbytes, time.monotonic() - start)
                self._unreported.append(job_id)
                self._cv.notify_all()

    def _rows(self, layer: int, blocks: np.ndarray) -> np.ndarray:
        return blocks * self._row_step[layer] + self._row_base[layer]

    def _wait_all(self, ios) -> tuple[bool, int]:
        ok, nbytes = True, 0
        for io in ios:
            result = self.store.wait(io, timeout_s=self.config.io_timeout_s, check=False)
            ok &= result.ok
            nbytes += result.bytes
        return ok, nbytes

    def _load(self, keys, blocks) -> tuple[bool, int]:
        ios = [self.store.load(keys, layer, self._regions[layer], blocks=self._rows(layer, blocks))
               for layer in range(len(self._regions))]
        ok, nbytes = self._wait_all(ios)
        if not ok:
            log.warning("tutti offloading: a load of %d blocks failed or did not verify", len(keys))
        return ok, nbytes

    def _store(self, keys, blocks, fence) -> tuple[bool, int]:
        if fence is not None:
            fence.synchronize()
        ios = [self.store.store(keys, layer, self._regions[layer], blocks=self._rows(layer, blocks))
               for layer in range(len(self._regions))]
        ok, nbytes = self._wait_all(ios)
        results = self.store.commit(keys, timeout_s=self.config.io_timeout_s, check=False)
        ok &= all(r.ok for r in results)
        not_ready = [r.key for r in results if r.status == tutti.StatusCode.NOT_READY]
        if not_ready:
            self.store.discard(not_ready)
        return ok, nbytes
