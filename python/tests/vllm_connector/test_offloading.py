"""tutti.vllm.TuttiOffloadingSpec under vLLM 0.33.0's own OffloadingConnector (scheduler and worker side,
built by KVConnectorFactory), with the real Scheduler and CPU KV caches in vLLM's layout: a prefix one
request offloaded is loaded back for a second request straight into vLLM's KV cache, bytes compared."""

import os
import time

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from tutti.kv_connector import stores  # noqa: E402
from tutti.kv_connector.config import ConfigError  # noqa: E402

import vllm_harness as H  # noqa: E402

PROMPT = list(range(100, 170))


@pytest.fixture
def offloading(data_dir):
    made = []

    def make(extra=None, **kwargs):
        config = {"spec_name": "TuttiOffloadingSpec", "spec_module_path": "tutti.vllm",
                  "path": os.path.join(data_dir, "kv", "rank{rank}"), "capacity_bytes": 32 << 20}
        config.update(extra or {})
        engine = H.Engine(os.path.join(data_dir, f"engine{len(made)}"), config, connector="OffloadingConnector",
                          module=None, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
    stores.close_all()


def step_until_stored(engine):
    """Steps until the manager has no store in flight: vLLM's offloading worker submits stores at the start of
    the next step and reports them done in a later one; until then the manager offers nothing (a request
    arriving meanwhile misses, as with vLLM's CPU tier). Bounded by 60 s."""
    manager = engine.connector.connector_scheduler.manager
    deadline = time.monotonic() + 60
    while manager._storing:
        assert time.monotonic() < deadline, "stores not reported done after 60 s"
        engine.step()
        time.sleep(0.01)


def test_an_offloaded_prefix_is_loaded_back_into_vllms_kv_cache(offloading, data_dir):
    engine = offloading()
    first = engine.request("first", PROMPT)
    engine.run()
    step_until_stored(engine)
    assert engine.scheduler.reset_prefix_cache()
    engine.scramble()
    second = engine.request("second", PROMPT)
    start = len(engine.scheduled)
    deadline = time.monotonic() + 60
    while not any("second" in s for s in engine.scheduled[start:]):  # vLLM loads asynchronously: the request
        assert time.monotonic() < deadline, "the load did not finish in 60 s"  # waits for its KV, then computes
        engine.step()
        time.sleep(0.01)
    files = sorted(os.listdir(os.path.join(data_dir, "kv", "rank0")))
    assert "index.mdb" in files and "layer-00000.kv" in files
    assert [s["second"] for s in engine.scheduled[start:] if "second" in s] == [70 - 64]  # 4 blocks loaded
    # the loaded blocks hold exactly what the first request computed (block hash, layer, rank)
    assert engine.check_blocks(second, 64) == 4 * engine.shape.layers
    engine.run()
    assert first.block_hashes[:4] == second.block_hashes[:4]


def test_blocks_the_store_evicts_are_announced_removed_and_only_those(offloading):
    page = H.Shape().spec.page_size_bytes
    engine = offloading({"capacity_bytes": 6 * page * H.Shape().layers}, events=True)  # 6 blocks per rank
    manager = engine.connector.connector_scheduler.manager
    assert manager.enable_events
    announced, removed = set(), set()
    real_take_events = manager.take_events

    def take_events():  # vLLM's scheduler drains the manager every step: keep what it hands out
        events = list(real_take_events())
        for event in events:
            (removed if event.removed else announced).update(event.keys)
        return events

    manager.take_events = take_events

    def drain():
        manager.take_events()

    for i, start in enumerate((100, 600, 1100)):  # 3 prompts of 4 full blocks each: 12 blocks into 6
        engine.request(f"r{i}", list(range(start, start + 70)))
        engine.run()
        step_until_stored(engine)
        drain()
    drain()  # every announced block checked at least once (fewer than REMOVAL_CHECKS_PER_CALL of them)
    assert len(announced) >= 8, announced
    assert removed, "the store evicted blocks but no removal was announced"
    assert removed <= announced
    for key in announced:  # removed exactly when no longer stored
        assert manager._stored(key) == (key not in removed), key.hex()[:16]
    assert real_take_events() == []  # each removal announced once


def test_without_kv_events_the_manager_records_nothing(offloading):
    engine = offloading()  # vLLM's default: no KV event publisher, so take_events is never drained
    manager = engine.connector.connector_scheduler.manager
    assert not manager.enable_events
    engine.request("first", PROMPT)
    engine.run()
    step_until_stored(engine)
    assert manager._events == [] and len(manager._announced) == 0


def test_a_failing_lookup_in_take_events_is_logged_and_retried_never_raised(offloading, caplog):
    engine = offloading(events=True)
    manager = engine.connector.connector_scheduler.manager
    engine.request("first", PROMPT)
    engine.run()
    step_until_stored(engine)
    manager.take_events()
    announced = list(manager._announced)
    assert announced
    real = manager._stored

    def broken(key):
        raise OSError("the store's directory is gone")

    manager._stored = broken
    assert manager.take_events() == []
    assert "checking announced blocks failed" in caplog.text
    assert list(manager._announced) == announced  # nothing lost: checked again at the next call
    manager._stored = real
    assert all(not e.removed for e in manager.take_events())
    assert set(manager._announced) == set(announced)


def test_the_spec_refuses_bad_extra_config_naming_the_key(offloading):
    with pytest.raises(ConfigError, match=r"kv_connector_extra_config\.capacity_bytes = -1"):
        offloading({"capacity_bytes": -1})
    with pytest.raises(ConfigError, match=r"kv_connector_extra_config\.pathh = '/x': unknown key"):
        offloading({"pathh": "/x"})


SPEC_REFUSALS = [
    (dict(extra={"blocks_per_chunk": 2}), r"kv_connector_extra_config\.blocks_per_chunk = 2: TuttiOffloadingSpec "
                                          r"stores vLLM blocks one by one"),
    (dict(extra={"canonical_layout": True}), r"kv_connector_extra_config\.canonical_layout = True: not supported"),
    (dict(tp=2, extra={"path": "/var/tmp/tutti-offload-no-rank"}),
     r"path = '/var/tmp/tutti-offload-no-rank': tensor_parallel_size = 2 needs \{rank\} in the path"),
    (dict(shape=H.Shape(head_size=8, kv_heads=1)), r"KV page = 512 bytes .*not a multiple of 4096 bytes"),
]


@pytest.mark.parametrize("args,message", SPEC_REFUSALS, ids=[m[:30] for _, m in SPEC_REFUSALS])
def test_the_spec_refuses_engine_settings_it_does_not_support(offloading, data_dir, args, message):
    args = dict(args)
    with pytest.raises(ConfigError, match=message):
        offloading(args.pop("extra", None), **args)
    assert not os.path.exists(os.path.join(data_dir, "kv")), "a refused configuration created the store"


def test_with_two_ranks_a_block_is_announced_removed_once_one_rank_no_longer_holds_it(data_dir):
    """tensor_parallel_size = 2: a block counts as stored only while every rank's store holds it, so the
    manager announces it removed once either rank's store lost it (here rank 1 drops it), and never a block
    both ranks still hold. The manager and the two rank stores are the real ones; vLLM is not started."""
    import tutti
    from tutti.kv_connector.config import parse_config
    from tutti.vllm.offloading import TuttiOffloadingManager

    config = parse_config({"path": os.path.join(data_dir, "kv", "rank{rank}"), "capacity_bytes": 8 << 20})
    page = 4096
    namespaces = [{"model": "tp2-events", "dtype": "float16", "tensor_layout": "NHD", "kv_split": False,
                   "cross_layer": True, "tp_rank": r, "tp_size": 2, "pp_stage": 0, "pp_size": 1,
                   "block_tokens": 16, "layers": 1, "piece_bytes": [page], "hash_algorithm": "sha256+offload-key",
                   "hash_seed": "test"} for r in range(2)]
    directories = [os.path.join(data_dir, "kv", f"rank{r}") for r in range(2)]
    kept, dropped = b"kept-by-both", b"dropped-by-rank-1"
    writers = [stores.open_writer(config, d, ns) for d, ns in zip(directories, namespaces)]
    try:
        for store in writers:
            source = store.register(tutti.empty((2, page), torch.uint8, "cpu"))
            store.wait(store.store([kept, dropped], 0, source, blocks=[0, 1]), 10)
            store.commit([kept, dropped])
        manager = TuttiOffloadingManager(config, directories, namespaces, enable_events=True)
        manager.complete_store([kept, dropped], None)
        first = list(manager.take_events())
        assert [(sorted(e.keys), e.removed) for e in first] == [(sorted([kept, dropped]), False)]
        assert writers[1].evict([dropped]) == 1  # rank 1's store no longer holds it (as after eviction)
        assert manager.lookup(dropped, None).name == "MISS" and manager.lookup(kept, None).name == "HIT"
        second = list(manager.take_events())
        assert [(e.keys, e.removed) for e in second] == [([dropped], True)]
        assert list(manager.take_events()) == []  # kept is checked again and still held by both: nothing
    finally:
        stores.close_all()
