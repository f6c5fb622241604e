"""tutti.vllm.TuttiConnector driven by vLLM 0.33.0's own Scheduler, KVConnectorFactory and
KVOutputAggregator on CPU tensors in vLLM's KV cache layout (vllm_harness.py says what stands in for
the model runner and the tensor-parallel executor, and why). Every test uses real stores on a real
file system (uring, O_DIRECT) and compares restored KV bytes with what was computed."""

import os
import threading
import time

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import tutti  # noqa: E402
from tutti.kv_connector import stores  # noqa: E402
from tutti.kv_connector.scheduler import SchedulerSide  # noqa: E402

import vllm_harness as H  # noqa: E402

PROMPT = list(range(100, 170))  # 70 tokens: 4 full blocks of 16 and 6 more


@pytest.fixture
def engines(data_dir):
    made = []

    def make(extra=None, **kwargs):
        config = {"path": os.path.join(data_dir, "kv", "rank{rank}"), "capacity_bytes": 32 << 20}
        config.update(extra or {})
        engine = H.Engine(os.path.join(data_dir, f"engine{len(made)}"), config, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
    stores.close_all()


def spy_matches(engine):
    """Records (request, local tokens, external tokens) of every get_num_new_matched_tokens call."""
    calls = []
    real = engine.connector.get_num_new_matched_tokens

    def spy(request, num_computed_tokens):
        result = real(request, num_computed_tokens)
        calls.append((request.request_id, num_computed_tokens, result[0]))
        return result

    engine.connector.get_num_new_matched_tokens = spy
    return calls


def fresh_gpu(engine):
    """vLLM's own prefix cache emptied and every KV byte overwritten: a hit must come from the store."""
    assert engine.scheduler.reset_prefix_cache()
    engine.scramble()


def test_a_prefix_stored_by_one_request_is_restored_for_a_second(engines):
    engine = engines()
    first = engine.request("first", PROMPT)
    engine.run()
    assert engine.store().lookup(list(first.block_hashes)) == 4  # committed before the blocks were freed
    assert engine.finished_sending[-1] == {"first"} or any("first" in s for s in engine.finished_sending)

    fresh_gpu(engine)
    matches = spy_matches(engine)
    second = engine.request("second", PROMPT)
    out = engine.step()
    assert matches == [("second", 0, 64)]          # 4 blocks; the last token is always computed
    assert out.has_sync_kv_loads and out.num_scheduled_tokens == {"second": 6}
    assert engine.load_errors[-1] == set()
    assert engine.check_blocks(second, 64) == 4 * engine.shape.layers  # every restored byte
    engine.run()
    stats = engine.workers[0].worker.statistics
    assert stats["loaded_blocks"] == 4 and stats["verified_bytes"] == 4 * engine.shape.layers * engine.page_bytes


def test_partial_hits_after_a_local_prefix_cache_hit_and_on_a_shorter_shared_prefix(engines):
    engine = engines(shape=H.Shape(num_blocks=24))
    first = engine.request("first", PROMPT)
    engine.run()
    # A request sharing 2 of the 4 stored blocks, then different tokens: a hit of 2 blocks.
    fresh_gpu(engine)
    matches = spy_matches(engine)
    shared = engine.request("shared", PROMPT[:32] + list(range(500, 540)))
    out = engine.step()
    assert matches[-1] == ("shared", 0, 32) and out.num_scheduled_tokens["shared"] == 72 - 32
    assert engine.check_blocks(shared, 32) == 2 * engine.shape.layers
    engine.run()

    # vLLM's own prefix cache keeps the first 2 blocks of the prompt (its last 2 evicted, as vLLM's
    # block pool evicts them under pressure): 2 blocks hit locally, the connector restores the other 2.
    fresh_gpu(engine)
    again = engine.request("again", PROMPT)
    engine.step()
    (again_ids,) = engine.scheduler.kv_cache_manager.get_block_ids("again")
    engine.run()
    engine.scheduler.kv_cache_manager.evict_blocks(set(again_ids[2:4]))
    matches.clear()
    third = engine.request("third", PROMPT)
    out = engine.step()
    assert matches == [("third", 32, 32)]
    assert out.num_scheduled_tokens["third"] == 6
    assert engine.check_blocks(third, 64) == 4 * engine.shape.layers
    engine.run()
    assert first.request_id not in engine.scheduler.requests


@pytest.mark.parametrize("failure", ["damaged", "evicted"])
def test_load_errors_are_reported_and_the_blocks_recomputed(engines, failure):
    engine = engines()
    first = engine.request("first", PROMPT)
    engine.run()
    keys = list(first.block_hashes)
    fresh_gpu(engine)
    if failure == "damaged":  # one stored byte of block 2, layer 1 flipped on disk: it fails XXH3-64
        H.damage(engine.store().directory, 1, H.pattern(keys[2], 1, 0, engine.page_bytes))
    else:  # evicted between the scheduler's lookup and the worker's load
        engine.after_schedule = lambda out: engine.store().evict([keys[2]])
    second = engine.request("second", PROMPT)
    out = engine.step()
    engine.after_schedule = None
    (block_ids,) = engine.scheduler.kv_cache_manager.get_block_ids("second")
    assert out.num_scheduled_tokens == {"second": 6}
    assert engine.load_errors[-1] == {block_ids[2]}        # reported by its vLLM block id
    assert second.num_computed_tokens == 2 * 16             # vLLM cut the request at the bad block
    assert second.num_output_tokens == 0                    # the step's token was dropped, not served
    out = engine.step()
    assert out.num_scheduled_tokens == {"second": 70 - 32}  # recomputed from block 2 on
    assert engine.check_blocks(second, 64) == 4 * engine.shape.layers
    engine.run()
    stats = engine.workers[0].worker.statistics
    assert stats["load_failures"] == 1
    if failure == "damaged":
        assert engine.store().statistics()["verification_failures"] >= 1
    assert engine.store().lookup(keys) == 4  # evicted after the failure, saved again after the recompute


def test_preemption_waits_for_the_saves_of_the_preempted_request_and_it_resumes_from_the_store(engines):
    engine = engines(shape=H.Shape(num_blocks=12))
    events = []
    for rank, worker in enumerate(engine.workers):
        inner = worker.worker
        real_finish, real_preempt = inner._finish, inner.handle_preemptions

        def finish(group, failed=False, _real=real_finish):
            if not any(e[0] == "preempted" for e in events):
                time.sleep(0.05)  # a slow disk: a save group is still running when vLLM preempts its request
            _real(group, failed)
            events.append(("saved", group.step, tuple(group.requests)))

        def preempt(preempted, _real=real_preempt, _inner=inner):
            running = [g for g in list(_inner._groups) if not g.done and set(preempted).intersection(g.requests)]
            _real(preempted)
            if preempted:
                events.append(("preempted", tuple(sorted(preempted)), len(running), all(g.done for g in running)))

        inner._finish, inner.handle_preemptions = finish, preempt
    matches = spy_matches(engine)
    a = engine.request("a", PROMPT[:64], max_tokens=90)
    b = engine.request("b", list(range(300, 364)), max_tokens=90)
    engine.run(max_steps=2000, timeout_s=120)
    preemptions = [e for e in events if e[0] == "preempted"]
    assert preemptions, "the scenario must preempt a request"
    # handle_preemptions returned only after every save group of the preempted request had finished, and
    # at least once such a group was still running when it was called (so the wait was exercised)
    assert all(e[3] for e in preemptions), preemptions
    assert sum(e[2] for e in preemptions) > 0, preemptions
    victim = preemptions[0][1][0]
    at = events.index(preemptions[0])
    # every save group holding the victim that was built before the preemption finished before
    # handle_preemptions returned (its blocks are overwritten afterwards)
    saved_before = {e[1] for e in events[:at] if e[0] == "saved" and victim in e[2]}
    assert saved_before, events[:at]
    # the victim came back through the waiting queue and restored what it had saved
    resumed = [m for m in matches if m[0] == victim]
    assert len(resumed) >= 2 and resumed[-1][2] > 0, matches
    for req in (a, b):
        assert req.num_output_tokens == 90
    # what the victim saved before and after its preemption is byte-exact in the store
    fresh_gpu(engine)
    again = engine.request("again", (a if victim == "a" else b).all_token_ids[:150])
    out = engine.step()
    assert out.num_scheduled_tokens["again"] < 150
    assert engine.check_blocks(again, 150 - out.num_scheduled_tokens["again"]) > 0
    engine.run()


def test_a_block_counts_as_stored_only_when_every_tensor_parallel_rank_committed_it(engines):
    engine = engines(tp=2)
    gate = threading.Event()
    slow = engine.workers[1].worker  # rank 1's disk is slow: its saver holds its commits until the gate opens
    real_finish = slow._finish

    def held_finish(group, failed=False):
        gate.wait(20)
        real_finish(group, failed)

    slow._finish = held_finish
    first = engine.request("first", PROMPT)
    for _ in range(6):
        engine.step()
    keys = list(first.block_hashes)
    assert engine.workers[0].worker.idle(10)
    assert engine.store(0).lookup(keys) == 4 and engine.store(1).lookup(keys) == 0
    assert engine.connector._scheduler.stored_prefix(keys) == 0  # the minimum over the ranks
    # rank 0 reported the request finished; vLLM's aggregator waits for rank 1: the blocks stay held
    assert "first" in engine.scheduler.requests
    assert not any("first" in s for s in engine.finished_sending)
    # no hit while one rank lacks the blocks (asked as the scheduler asks for a new request)
    early = engine.make_request("early", PROMPT)
    assert engine.connector.get_num_new_matched_tokens(early, 0) == (0, False)
    gate.set()
    engine.run()
    assert any("first" in s for s in engine.finished_sending)
    assert engine.store(1).lookup(keys) == 4
    fresh_gpu(engine)
    matches = spy_matches(engine)
    late = engine.request("late", PROMPT)
    out = engine.step()
    assert matches[-1] == ("late", 0, 64) and out.num_scheduled_tokens == {"late": 6}
    assert engine.check_blocks(late, 64) == 2 * 4 * engine.shape.layers  # each rank restored its own bytes
    engine.run()


def test_the_scheduler_side_reads_other_processes_stores_read_only_and_takes_the_minimum(data_dir):
    """Workers in other processes (as vLLM's multiprocess executor runs them) commit; this process only
    opens their stores read-only."""
    import subprocess
    import sys

    config_path = os.path.join(data_dir, "kv", "rank{rank}")
    script = f"""
import torch, tutti
from tutti.kv_connector.config import parse_config, EngineFacts
from tutti.kv_connector.worker import Worker
from tutti.kv_connector.metadata import StepMetadata, BlockTransfer
config = parse_config({{"path": {config_path!r}, "capacity_bytes": 8 << 20}})
facts = EngineFacts(model="m@", kv_dtype="float16", cache_dtype="auto", block_size=16, num_kv_heads=2, head_size=64,
                    head_size_v=64, page_bytes=8192, layer_names=("l0", "l1"), kv_cache_layout="LBNHC",
                    spec_kind="FullAttentionSpec", kv_cache_groups=1, hash_algorithm="sha256",
                    python_hash_seed=None, tp_size=2)
keys = [bytes([i]) * 32 for i in range(5)]
for rank, n in ((0, 5), (1, 3)):
    w = Worker(config, facts.with_rank(rank))
    raw = tutti.empty(2 * 8 * 8192, torch.uint8)
    w.register_kv_caches({{"l0": raw[:8 * 8192].view(8, 8192), "l1": raw[8 * 8192:].view(8, 8192)}})
    w.bind(StepMetadata(step=1, saves=[BlockTransfer("r", keys[:n], list(range(n)))]))
    w.wait_for_save()
    assert w.idle(30)
    w.close()
print("ok")
"""
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.stdout.strip().endswith("ok"), result.stderr
    from tutti.kv_connector.config import EngineFacts, parse_config

    config = parse_config({"path": config_path, "capacity_bytes": 8 << 20})
    facts = EngineFacts(model="m@", kv_dtype="float16", cache_dtype="auto", block_size=16, num_kv_heads=2,
                        head_size=64, head_size_v=64, page_bytes=8192, layer_names=("l0", "l1"),
                        kv_cache_layout="LBNHC", spec_kind="FullAttentionSpec", kv_cache_groups=1,
                        hash_algorithm="sha256", python_hash_seed=None, tp_size=2)
    side = SchedulerSide(config, facts)
    keys = [bytes([i]) * 32 for i in range(5)]
    try:
        assert side.stored_prefix(keys) == 3
        assert stores.lookup(config, config.directory(0), side.namespaces[0], keys) == 5
        assert side.matched_tokens("r", keys, 5 * 16 + 1, 0) == 3 * 16
    finally:
        stores.close_all()


def test_eviction_under_the_byte_bound_leaves_a_shorter_prefix_and_never_a_bad_load(engines):
    page = H.Shape().spec.page_size_bytes
    engine = engines({"capacity_bytes": 6 * page * H.Shape().layers})  # 6 blocks per rank
    first = engine.request("first", PROMPT)
    engine.run()
    other = engine.request("other", list(range(600, 670)))
    engine.run()
    keys = list(first.block_hashes)
    stats = engine.store().statistics()
    assert stats["evictions"] >= 2
    left = engine.store().lookup(keys)
    assert left < 4
    fresh_gpu(engine)
    matches = spy_matches(engine)
    second = engine.request("second", PROMPT)
    engine.step()
    assert matches == [("second", 0, 16 * left)]
    assert engine.load_errors[-1] == set()
    assert engine.check_blocks(second, 16 * left) == left * engine.shape.layers
    engine.run()
    assert engine.store().lookup(list(other.block_hashes)) >= 0


def test_cross_layer_layout_round_trip(engines):
    engine = engines(layout="BLNHC")
    engine.request("first", PROMPT)
    engine.run()
    fresh_gpu(engine)
    second = engine.request("second", PROMPT)
    out = engine.step()
    assert out.num_scheduled_tokens == {"second": 6}
    assert engine.check_blocks(second, 64) == 4 * engine.shape.layers
    engine.run()


class _LoadLog:
    """Stands in front of a worker's store and logs ("submit", layer) and ("wait", layer) of its loads."""

    def __init__(self, store):
        self._store, self.log, self._layer_of = store, [], {}

    def __getattr__(self, name):
        return getattr(self._store, name)

    def load(self, keys, layer, *args, **kwargs):
        io = self._store.load(keys, layer, *args, **kwargs)
        self._layer_of[id(io)] = layer
        self.log.append(("submit", layer))
        return io

    def wait(self, io, *args, **kwargs):
        layer = self._layer_of.pop(id(io), None)
        if layer is not None:
            self.log.append(("wait", layer))
        return self._store.wait(io, *args, **kwargs)


@pytest.mark.parametrize("lookahead", [1, 2, 5])
def test_layer_l_is_waited_for_while_the_next_lookahead_layers_are_already_loading(engines, lookahead):
    layers = 5
    engine = engines({"lookahead_layers": lookahead}, shape=H.Shape(layers=layers))
    engine.request("first", PROMPT)
    engine.run()
    fresh_gpu(engine)
    inner = engine.workers[0].worker
    logged = inner.store = _LoadLog(inner.store)
    second = engine.request("second", PROMPT)
    engine.step()
    assert engine.load_errors[-1] == set()
    assert engine.check_blocks(second, 64) == 4 * layers
    waits = [layer for what, layer in logged.log if what == "wait"]
    assert waits == list(range(layers)), logged.log  # each layer waited for once, in order
    for layer in range(layers):
        submitted = {n for what, n in logged.log[:logged.log.index(("wait", layer))] if what == "submit"}
        # while layer L is waited for (its compute is next), layers L+1 .. L+lookahead are in flight
        assert submitted == set(range(min(layer + lookahead, layers - 1) + 1)), (layer, logged.log)
    engine.run()


def test_stored_blocks_are_announced_as_kv_events_once_every_rank_committed(engines):
    engine = engines(tp=2, events=True)
    first = engine.request("first", PROMPT)
    engine.run()
    stored = [e for e in engine.events if type(e).__name__ == "BlockStored" and e.medium == "STORAGE"]
    assert any(type(e).__name__ == "BlockStored" and e.medium == "GPU" for e in engine.events)  # vLLM's own
    assert sorted(h for e in stored for h in e.block_hashes) == sorted(first.block_hashes[:4])
    for e in stored:
        index = list(first.block_hashes).index(e.block_hashes[0])
        assert e.medium == "STORAGE" and e.token_ids == PROMPT[16 * index:16 * index + 16]
        assert e.parent_block_hash == (first.block_hashes[index - 1] if index else None)


def test_kv_producer_saves_only_and_kv_consumer_loads_only(engines, data_dir):
    # one model identity for both engines (their model folders differ: the default identity is the path)
    producer = engines({"model_name": "tiny-llama"}, kv_role="kv_producer")
    producer.request("p", PROMPT)
    producer.run()
    producer.close()
    stores.close_all()
    consumer = engines({"model_name": "tiny-llama"}, kv_role="kv_consumer")
    second = consumer.request("c", PROMPT)
    out = consumer.step()
    assert out.num_scheduled_tokens == {"c": 6}
    assert consumer.check_blocks(second, 64) == 4 * consumer.shape.layers
    consumer.run()
    assert consumer.workers[0].worker.statistics["saved_blocks"] == 0


def test_vllm_version_check_names_the_supported_release():
    from tutti.vllm import check_vllm_version

    check_vllm_version("0.33.0")
    check_vllm_version("0.33.2")
    with pytest.raises(ImportError, match=r"supports vLLM 0\.33\.x .* installed vLLM is 0\.34\.0"):
        check_vllm_version("0.34.0")
    with pytest.raises(ImportError, match="0.3.3"):
        check_vllm_version("0.3.3")


def test_the_store_namespace_records_the_hash_algorithm_and_a_digest_of_the_seed(engines):
    engine = engines()
    ns = engine.store().namespace
    assert ns["hash_algorithm"] == "sha256" and ns["hash_seed"].startswith("sha256:")
    assert "vllm-none-hash" not in ns["hash_seed"]
    assert ns["piece_bytes"] == [engine.page_bytes] and ns["layers"] == engine.shape.layers
    assert ns["tensor_layout"] == "NHD" and ns["block_tokens"] == 16


def test_the_worker_calls_vllm_made_are_recorded_and_replay_without_vllm(engines, data_dir):
    """The recording the GPU machine replays (test_gpu_replay.py): one request stores a prefix, a second
    restores it. TUTTI_WRITE_RECORDING=1 writes it to data/recorded_calls.json."""
    import json

    import replay as R

    record = os.path.join(data_dir, "calls-rank{rank}.json")
    engine = engines({"record_calls": record, "lookahead_layers": 1})
    engine.request("first", PROMPT)
    engine.run()
    fresh_gpu(engine)
    second = engine.request("second", PROMPT)
    engine.step()
    assert engine.check_blocks(second, 64) == 4 * engine.shape.layers
    engine.run()
    engine.close()  # the worker writes the recording when it closes
    recording = R.load(record.format(rank=0))
    names = [c["call"] for c in recording["calls"]]
    assert names[0] == "register_kv_caches"
    assert {"bind", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished",
            "get_block_ids_with_load_errors"} <= set(names)
    loads = [c for c in recording["calls"] if c["call"] == "bind" and c["meta"]["loads"]]
    assert len(loads) == 1 and loads[0]["meta"]["loads"][0]["keys"] == [h.hex() for h in second.block_hashes[:4]]
    result = R.replay(recording, os.path.join(data_dir, "replay"), "cpu")
    assert result.loaded_pages_compared == 4 * engine.shape.layers and result.saved_blocks == 4
    if os.environ.get("TUTTI_WRITE_RECORDING"):
        recording["facts"]["model"] = "recorded-model@"  # the run's model folder is a temporary path
        with open(os.path.join(os.path.dirname(__file__), "data", "recorded_calls.json"), "w") as f:
            json.dump(recording, f, indent=1)
            f.write("\n")


def test_the_nvme_soft_backend_restores_a_prefix_through_nvme_commands(engines, ext4):
    """backend nvme-soft: every IO of the store an NVMe command on the soft controller's queues over a
    loop-mounted ext4 image (conftest's ext4 fixture; root)."""
    engine = engines({"path": os.path.join(ext4.mount_point, "kv", "rank{rank}"), "capacity_bytes": 8 << 20,
                      "backend": "nvme-soft", "backend_options": ext4.runtime_options()})
    engine.request("first", PROMPT)
    engine.run()
    fresh_gpu(engine)
    ext4.drop_caches()
    second = engine.request("second", PROMPT)
    out = engine.step()
    assert out.num_scheduled_tokens == {"second": 6} and engine.load_errors[-1] == set()
    assert engine.check_blocks(second, 64) == 4 * engine.shape.layers
    engine.run()
    assert engine.workers[0].worker.statistics["loaded_blocks"] == 4


def test_counters_reach_vllms_stats_loggers_and_the_start_up_line_names_the_store(engines):
    """The connector's counters go through vLLM's own KV connector stats path: each worker's
    get_kv_connector_stats in its KVConnectorOutput, KVOutputAggregator summing the ranks, the Scheduler
    adding the scheduler side's and attaching them to SchedulerStats, and vLLM's KVConnectorLogging
    rebuilding and reducing them. A stored prefix restored for a second request counts 4 blocks looked up
    and hit, 4 loaded, the bytes of every layer, and the saves of the first request."""
    import logging

    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    keep = Keep()
    logger = logging.getLogger("vllm.tutti")  # INFO under `vllm serve`; the tests' vLLM logs warnings only
    level = logger.level
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    try:
        engine = engines(tp=2)
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    worker_lines = [line for line in lines if "KV store" in line]
    assert len(worker_lines) == 2 and len(lines) == 3  # one line per worker-side rank, one for the scheduler
    assert os.path.join("kv", "rank1") in worker_lines[1] and "backend uring" in worker_lines[1]
    assert f"{engine.page_bytes} bytes per block and layer, {engine.shape.layers} layers" in worker_lines[0]
    assert "verify loads on" in worker_lines[0]

    engine.request("first", PROMPT)
    engine.run()
    fresh_gpu(engine)
    second = engine.request("second", PROMPT)
    engine.step()
    assert engine.check_blocks(second, 64) == 2 * 4 * engine.shape.layers  # both ranks, every byte compared
    engine.run()

    logging_ = KVConnectorLogging(engine.config.kv_transfer_config)
    for payload in engine.connector_stats:
        logging_.observe(payload)
    totals = logging_.transfer_stats_accumulator
    assert type(totals).__name__ == "TuttiConnectorStats"
    d = totals.data
    ranks, layer_bytes = 2, engine.shape.layers * engine.page_bytes
    assert d["hit_blocks"] == 4 and d["looked_up_blocks"] >= 8 and d["lookups"] >= 2
    assert d["loaded_blocks"] == 4 * ranks and d["load_failures"] == 0
    assert d["load_bytes"] == d["verified_bytes"] == 4 * ranks * layer_bytes
    assert d["saved_blocks"] == 4 * ranks and d["save_failures"] == 0   # "second" found its blocks stored
    assert d["stored_bytes"] == 4 * ranks * layer_bytes
    assert d["load_wait_s"] > 0 and d["save_s"] > 0
    summary = totals.reduce()
    assert summary["Blocks hit"] == 4 and summary["Bytes loaded"] == 4 * ranks * layer_bytes
    # The totals on the connector agree with what went through vLLM.
    assert sum(w.statistics()["loaded_blocks"] for w in engine.workers) == d["loaded_blocks"]
    assert engine.connector.statistics()["hit_blocks"] == 4
