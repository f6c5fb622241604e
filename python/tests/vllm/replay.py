"""Plays back a recording of the worker-side calls vLLM made to TuttiConnector (``record_calls``) through
``tutti.kv_connector.worker.Worker``, without vLLM: the same steps, the same block hashes and block ids,
on KV cache tensors in the recorded layout on any torch device (CUDA on the GPU machine).

What vLLM's model computed is stood in for as in the CPU run: before ``save_kv_layer(L)`` the pages of
the blocks the step saves get pattern(hash, L, rank) (kv_pages.py). Before a step with loads, the load
targets are overwritten, and after each ``wait_for_layer_load(L)`` every loaded page of layer L is
compared with the pattern of its hash: a byte that did not come from the store fails the replay.

On CUDA each layer's "compute" is a kernel on the current stream, timed with CUDA events, and each
``wait_for_layer_load`` is timed on the host: the figures say how much of the loads hid behind compute.
"""

from __future__ import annotations

import dataclasses
import json
import time

import torch

import tutti
from kv_pages import page_of, pattern, write_page
from tutti.kv_connector.config import EngineFacts, parse_config
from tutti.kv_connector.metadata import StepMetadata
from tutti.kv_connector.worker import Worker


@dataclasses.dataclass
class ReplayResult:
    steps: int = 0
    loaded_pages_compared: int = 0
    saved_blocks: int = 0
    load_steps: list = dataclasses.field(default_factory=list)  # per step with loads: timings (ms)


def kv_caches_like(recording: dict, device: str) -> dict[str, torch.Tensor]:
    """Per-layer views over one 4096-byte-aligned allocation, with the recorded shape, strides and offsets."""
    info = recording["kv_caches"]
    dtype = getattr(torch, info["dtype"])
    elem = torch.empty(0, dtype=dtype).element_size()
    raw = tutti.empty(info["allocation_bytes"], torch.uint8, device=device)
    raw.fill_(0)
    typed = raw.view(dtype)
    views = {}
    for name, offset in zip(recording["facts"]["layer_names"], info["byte_offsets"]):
        views[name] = typed.as_strided(info["shape"], info["stride"], typed.storage_offset() + offset // elem)
    return views


def replay(recording: dict, directory: str, device: str = "cpu", *, compute_matmul: int = 0) -> ReplayResult:
    """Replays `recording` (a dict from the JSON file) into a store at `directory` on `device`. With
    `compute_matmul` > 0 each layer's compute is a (n x n) matmul on the current CUDA stream."""
    facts_data = dict(recording["facts"])
    facts_data["layer_names"] = tuple(facts_data["layer_names"])
    facts = EngineFacts(**facts_data)
    rank = facts.tp_rank
    config = parse_config({"path": directory, "capacity_bytes": recording["config"]["capacity_bytes"],
                           "lookahead_layers": recording["config"]["lookahead_layers"],
                           "verify_loads": recording["config"]["verify_loads"]})
    worker = Worker(config, dataclasses.replace(facts, tp_size=1, tp_rank=0, dp_size=1, dp_rank=0))
    views = kv_caches_like(recording, device)
    page = facts.page_bytes
    layers = list(facts.layer_names)
    cuda = device.startswith("cuda")
    a = b = None
    if cuda and compute_matmul:
        a = torch.randn(compute_matmul, compute_matmul, device=device)
        b = torch.randn(compute_matmul, compute_matmul, device=device)
    result = ReplayResult()
    meta: StepMetadata | None = None
    timing: dict | None = None
    try:
        for call in recording["calls"]:
            name = call["call"]
            if name == "register_kv_caches":
                worker.register_kv_caches(views)
            elif name == "handle_preemptions":
                worker.handle_preemptions(call["preempted"])
            elif name == "bind":
                meta = StepMetadata.from_json(call["meta"])
                result.steps += 1
                if meta.loads:
                    # In the CPU run the scheduler offered these blocks only after every save was committed.
                    assert worker.idle(60), "saves of earlier steps still running after 60 s"
                    for view in views.values():
                        for t in meta.loads:
                            for block in t.block_ids:
                                view[block].view(torch.uint8).fill_(0xA5)  # what a reused GPU block holds
                    if cuda:
                        torch.cuda.synchronize()
                    timing = {"step_start": time.perf_counter(), "wait_ms": [], "compute_ms": [], "events": []}
                worker.bind(meta)
            elif name == "start_load_kv":
                worker.start_load()
            elif name == "wait_for_layer_load":
                layer = layers.index(call["layer"])
                t0 = time.perf_counter()
                worker.wait_for_layer_load(call["layer"])
                if timing is not None:
                    timing["wait_ms"].append((time.perf_counter() - t0) * 1e3)
                for t in meta.loads:
                    for key, block in zip(t.keys, t.block_ids):
                        got = page_of(views[call["layer"]], block)
                        want = pattern(key, layer, rank, page, device=got.device)
                        assert torch.equal(got, want), f"layer {layer} block {block} (key {key.hex()[:16]}) differs"
                        result.loaded_pages_compared += 1
                if timing is not None and a is not None:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    torch.matmul(a, b)
                    end.record()
                    timing["events"].append((start, end))
            elif name == "save_kv_layer":
                layer = layers.index(call["layer"])
                for t in meta.saves:
                    for key in t.keys:
                        block = t.block_ids[t.keys.index(key)]
                        write_page(views[call["layer"]], block, pattern(key, layer, rank, page, device=device))
                worker.save_layer(call["layer"])
            elif name == "wait_for_save":
                worker.wait_for_save()
                if timing is not None:
                    if cuda:
                        torch.cuda.synchronize()
                    timing["step_ms"] = (time.perf_counter() - timing["step_start"]) * 1e3
                    timing["compute_ms"] = [s.elapsed_time(e) for s, e in timing.pop("events")]
                    timing.pop("step_start")
                    timing["blocks"] = sum(len(t.keys) for t in meta.loads)
                    result.load_steps.append(timing)
                    timing = None
            elif name == "get_finished":
                worker.get_finished(call["finished"])
            elif name == "get_block_ids_with_load_errors":
                errors = worker.take_load_errors()
                assert errors == set(call["result"]), f"load errors {sorted(errors)}, vLLM's run had {call['result']}"
            else:
                raise AssertionError(f"unknown recorded call {name!r}")
        assert worker.idle(60)
        result.saved_blocks = worker.statistics["saved_blocks"]
    finally:
        worker.close()
    return result


def load(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    assert data.get("format") == "tutti-vllm-calls/1", f"{path}: not a recording of tutti-vllm-calls/1"
    return data
