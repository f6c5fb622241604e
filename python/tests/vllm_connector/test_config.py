"""Every configuration TuttiConnector refuses at start-up, built through vLLM 0.33.0's own
KVConnectorFactory from a real VllmConfig: the error names the key (or the engine setting) and the value,
and nothing is created on disk by a refused configuration."""

import os
import re

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,  # noqa: E402
                                        KVQuantMode, SlidingWindowSpec)

from tutti.kv_connector import stores  # noqa: E402
from tutti.kv_connector.config import DEFAULTS, ConfigError  # noqa: E402

import vllm_harness as H  # noqa: E402

SCHEDULER, WORKER = KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER


@pytest.fixture(autouse=True)
def close_stores():
    yield
    stores.close_all()


def good(data_dir) -> dict:
    return {"path": os.path.join(data_dir, "kv", "rank{rank}"), "capacity_bytes": 32 << 20}


def build(data_dir, extra, role=SCHEDULER, shape=H.Shape(), kv_config=None, tweak=None, **config_args):
    config = H.vllm_config(os.path.join(data_dir, "engine"), extra, shape, **config_args)
    if tweak:
        tweak(config)
    return KVConnectorFactory.create_connector(config, role, kv_config or H.kv_cache_config(shape))


BAD_EXTRA = [
    ({"pat": "/kv"}, r"kv_connector_extra_config\.pat = '/kv': unknown key; the keys are backend, "),
    ({"path": None}, r"kv_connector_extra_config\.path is required"),
    ({"capacity_bytes": None}, r"kv_connector_extra_config\.capacity_bytes is required"),
    ({"path": "kv/rank{rank}"}, r"path = 'kv/rank\{rank\}': must be an absolute path"),
    ({"path": ""}, r"path = '': must be a non-empty string"),
    ({"path": 7}, r"path = 7: must be a non-empty string"),
    ({"path": "/kv/{node}"}, r"path = '/kv/\{node\}': has the placeholder \{node\}; only \{rank\} and \{dp_rank\}"),
    ({"path": "/kv/{rank"}, r"path = '/kv/\{rank': is not a valid template"),
    ({"capacity_bytes": 0}, r"capacity_bytes = 0: must be a positive int"),
    ({"capacity_bytes": -4096}, r"capacity_bytes = -4096: must be a positive int"),
    ({"capacity_bytes": "1G"}, r"capacity_bytes = '1G': must be a positive int"),
    ({"capacity_bytes": True}, r"capacity_bytes = True: must be a positive int"),
    ({"backend": "spdk"}, r"backend = 'spdk': must be one of uring, nvme-soft"),
    ({"backend_options": ["sqpoll"]}, r"backend_options = \['sqpoll'\]: must be a dict"),
    ({"lookahead_layers": 0}, r"lookahead_layers = 0: must be an int >= 1"),
    ({"lookahead_layers": 1.5}, r"lookahead_layers = 1\.5: must be an int >= 1"),
    ({"verify_loads": "yes"}, r"verify_loads = 'yes': must be true or false"),
    ({"io_timeout_s": 0}, r"io_timeout_s = 0: must be a positive number of seconds"),
    ({"io_timeout_s": float("nan")}, r"io_timeout_s = nan: must be a positive number"),
    ({"io_timeout_s": float("inf")}, r"io_timeout_s = inf: must be a positive number"),
    ({"host_checksum_threads": -1}, r"host_checksum_threads = -1: must be an int in 0\.\.64"),
    ({"host_checksum_threads": 65}, r"host_checksum_threads = 65: must be an int in 0\.\.64"),
    ({"model_name": ""}, r"model_name = '': must be a non-empty string"),
    ({"record_calls": "calls.json"}, r"record_calls = 'calls\.json': must be an absolute path"),
]


@pytest.mark.parametrize("change,message", BAD_EXTRA, ids=[m.split(" ")[0][:40] for _, m in BAD_EXTRA])
@pytest.mark.parametrize("role", [SCHEDULER, WORKER], ids=["scheduler", "worker"])
def test_bad_extra_config_is_refused_naming_the_key_and_the_value(data_dir, change, message, role):
    extra = good(data_dir)
    for key, value in change.items():
        if value is None:
            extra.pop(key)
        else:
            extra[key] = value
    with pytest.raises(ConfigError, match=message):
        build(data_dir, extra, role)
    assert not os.path.exists(os.path.join(data_dir, "kv"))


def test_the_defaults_table_and_docs_vllm_md_list_the_same_keys():
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "vllm.md")
    if not os.path.exists(docs):
        pytest.skip("docs/vllm.md is not next to these tests (installed elsewhere)")
    text = open(docs).read()
    section = text.split("## Configuration", 1)[1].split("Engine settings refused", 1)[0]  # the keys' table
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    assert documented == set(DEFAULTS)


def set_parallel(**fields):
    def tweak(config):
        for name, value in fields.items():  # the CPU build of ParallelConfig cannot describe several ranks
            object.__setattr__(config.parallel_config, name, value)
    return tweak


def test_non_cryptographic_hash_without_pythonhashseed_is_refused_naming_both(data_dir, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for algo in ("xxhash", "xxhash_cbor"):
        with pytest.raises(ConfigError, match=rf"prefix_caching_hash_algo = '{algo}' with PYTHONHASHSEED unset"):
            build(data_dir, good(data_dir), hash_algo=algo)
    # the cryptographic ones have vLLM's fixed default seed; a set PYTHONHASHSEED makes xxhash stable
    build(data_dir, good(data_dir), hash_algo="sha256_cbor")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    connector = build(data_dir, good(data_dir), hash_algo="xxhash")
    assert connector._scheduler.namespaces[0]["hash_algorithm"] == "xxhash"


def test_the_seed_is_part_of_the_namespace(data_dir, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    one = build(data_dir, good(data_dir), hash_algo="xxhash")._scheduler.namespaces[0]["hash_seed"]
    monkeypatch.setenv("PYTHONHASHSEED", "2")
    two = build(data_dir, good(data_dir), hash_algo="xxhash")._scheduler.namespaces[0]["hash_seed"]
    monkeypatch.delenv("PYTHONHASHSEED")
    default = build(data_dir, good(data_dir))._scheduler.namespaces[0]["hash_seed"]
    assert len({one, two, default}) == 3
    assert all(s.startswith("sha256:") and len(s) == 39 for s in (one, two, default))  # a digest, not the seed


ENGINE_SETTINGS = [
    (dict(policy="fail"), None, r"kv_transfer_config\.kv_load_failure_policy = 'fail': .*\"recompute\""),
    (dict(layout="LHBNC"), None, r"kv_cache_layout = 'LHBNC': a block of one layer is not one contiguous page"),
    (dict(layout="BHLNC"), None, r"kv_cache_layout = 'BHLNC'"),
    (dict(tp=2, extra={"path": "/var/tmp/tutti-kv-no-rank"}), None,
     r"path = '/var/tmp/tutti-kv-no-rank': tensor_parallel_size = 2 needs \{rank\} in the path"),
    ({}, set_parallel(pipeline_parallel_size=2),
     r"parallel_config\.pipeline_parallel_size = 2: pipeline parallelism is not supported"),
    ({}, set_parallel(decode_context_parallel_size=2),
     r"parallel_config\.decode_context_parallel_size = 2: decode context parallelism is not supported"),
    ({}, set_parallel(prefill_context_parallel_size=2),
     r"parallel_config\.prefill_context_parallel_size = 2: prefill context parallelism"),
    ({}, set_parallel(data_parallel_size=2), r"data_parallel_size = 2 needs \{dp_rank\} in the path"),
    ({}, lambda c: setattr(c.cache_config, "cache_dtype", "int8_per_token_head"),
     r"cache_config\.cache_dtype = 'int8_per_token_head': not supported"),
    (dict(shape=H.Shape(head_size=8, kv_heads=1)), None,
     r"KV page = 512 bytes \(block_size 16 x num_kv_heads 1 x \(head_size 8 \+ 8\) x float16\): not a multiple "
     r"of 4096"),
]


@pytest.mark.parametrize("args,tweak,message", ENGINE_SETTINGS, ids=[m[:30] for _, _, m in ENGINE_SETTINGS])
@pytest.mark.parametrize("role", [SCHEDULER, WORKER], ids=["scheduler", "worker"])
def test_unsupported_engine_settings_are_refused_naming_the_setting(data_dir, args, tweak, message, role):
    args = dict(args)
    extra = good(data_dir)
    extra.update(args.pop("extra", {}))
    with pytest.raises(ConfigError, match=message):
        build(data_dir, extra, role, tweak=tweak, **args)


def test_hybrid_allocator_and_other_attention_kinds_are_refused(data_dir):
    shape = H.Shape()
    names = shape.layer_names
    two_groups = KVCacheConfig(num_blocks=shape.num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(names[:1], shape.spec),
                                                KVCacheGroupSpec(names[1:], shape.spec)])
    with pytest.raises(ConfigError, match=r"kv_cache_groups = 2 groups: the hybrid KV cache allocator \(HMA\)"):
        build(data_dir, good(data_dir), kv_config=two_groups)
    window = SlidingWindowSpec(block_size=16, num_kv_heads=shape.kv_heads, head_size=shape.head_size,
                               dtype=shape.dtype, sliding_window=64)
    sliding = KVCacheConfig(num_blocks=shape.num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(names, window)])
    with pytest.raises(ConfigError, match=r"kv_cache_spec = SlidingWindowSpec: only full attention"):
        build(data_dir, good(data_dir), kv_config=sliding)


def one_group(shape, names=None, **spec_changes) -> KVCacheConfig:
    """The harness's KV cache configuration with its one spec changed (a field vLLM sets for other models)."""
    spec = FullAttentionSpec(block_size=shape.block_size, num_kv_heads=shape.kv_heads, head_size=shape.head_size,
                             dtype=shape.dtype, **spec_changes)
    return KVCacheConfig(num_blocks=shape.num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(shape.layer_names if names is None else names, spec)])


def unresolved_layout(config):
    config.cache_config.kv_cache_layout = None


KV_CACHE_CONFIGS = [
    (lambda shape: KVCacheConfig(num_blocks=shape.num_blocks, kv_cache_tensors=[], kv_cache_groups=[]), None,
     r"kv_cache_config\.kv_cache_groups is empty: the model has no KV cache"),
    (lambda shape: one_group(shape, page_size_padded=shape.spec.page_size_bytes + 4096), None,
     r"kv_cache_spec\.page_size_padded = \d+ bytes \(page \d+ bytes\): padded pages \(hybrid models\) are not "
     r"supported"),
    (lambda shape: one_group(shape, kv_quant_mode=KVQuantMode.FP8_PER_TENSOR), None,
     r"kv_cache_spec\.kv_quant_mode = FP8_PER_TENSOR: quantized caches with scales in the pages are not supported"),
    (lambda shape: one_group(shape, names=[]), None, r"kv_cache_config: no attention layers"),
    (None, unresolved_layout, r"cache_config\.kv_cache_layout is not resolved"),
    (None, lambda c: setattr(c.kv_transfer_config, "kv_role", "kv_bogus"),
     r"kv_transfer_config\.kv_role = 'kv_bogus': must be one of kv_both"),
]


@pytest.mark.parametrize("make,tweak,message", KV_CACHE_CONFIGS, ids=[m[:30] for _, _, m in KV_CACHE_CONFIGS])
@pytest.mark.parametrize("role", [SCHEDULER, WORKER], ids=["scheduler", "worker"])
def test_kv_cache_configurations_vllm_makes_for_other_models_are_refused_naming_the_field(data_dir, make, tweak,
                                                                                        message, role):
    shape = H.Shape()
    with pytest.raises(ConfigError, match=message):
        build(data_dir, good(data_dir), role, kv_config=make(shape) if make else None, tweak=tweak)
    assert not os.path.exists(os.path.join(data_dir, "kv")), "a refused configuration created the store"


def test_bad_backend_options_and_bad_store_paths_fail_at_register_kv_caches(data_dir):
    shape = H.Shape()
    worker = build(data_dir, dict(good(data_dir), backend_options={"queue_dept": 8}), WORKER)
    with pytest.raises(ConfigError, match=r"backend = 'uring', backend_options = \{'queue_dept': 8\}: .*queue_dept"):
        worker.register_kv_caches(H.kv_caches(shape))

    afile = os.path.join(data_dir, "a-file")
    open(afile, "w").close()
    worker = build(data_dir, dict(good(data_dir), path=afile), WORKER)
    with pytest.raises(ConfigError, match=rf"path = '{afile}': {afile} exists and is not a directory"):
        worker.register_kv_caches(H.kv_caches(shape))
    worker = build(data_dir, dict(good(data_dir), path=afile + "/sub/rank{rank}"), WORKER)
    with pytest.raises(ConfigError, match=r"path = .*cannot create the parent of"):
        worker.register_kv_caches(H.kv_caches(shape))


def test_a_store_of_another_model_shape_is_refused_naming_the_field(data_dir):
    first = build(data_dir, good(data_dir), WORKER)
    first.register_kv_caches(H.kv_caches(H.Shape()))
    first.shutdown()
    stores.close_all()
    other = H.Shape(block_size=32)
    worker = build(data_dir, good(data_dir), WORKER, shape=other)
    with pytest.raises(ConfigError, match=r"path = .*the store cannot be opened: .*block_tokens: stored 16, "
                                          r"requested 32"):
        worker.register_kv_caches(H.kv_caches(other))


def test_kv_caches_that_are_not_vllm_pages_are_refused(data_dir):
    shape = H.Shape()
    worker = build(data_dir, good(data_dir), WORKER)
    caches = H.kv_caches(shape)
    missing = dict(caches)
    missing.pop(shape.layer_names[1])
    with pytest.raises(ConfigError, match=r"no KV cache for layer 'model\.layers\.1\.self_attn\.attn'"):
        worker.register_kv_caches(missing)
    # a layer with fewer blocks than the others
    short = dict(caches)
    short[shape.layer_names[2]] = caches[shape.layer_names[2]][:shape.num_blocks - 1]
    with pytest.raises(ConfigError, match=rf"layer 'model\.layers\.2\.self_attn\.attn' has {shape.num_blocks - 1} "
                                          rf"blocks, other layers {shape.num_blocks}"):
        worker.register_kv_caches(short)
    # a layer view whose block is not one contiguous page (the heads outermost in memory)
    split = dict(caches)
    name = shape.layer_names[0]
    split[name] = caches[name].permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)  # heads outermost
    with pytest.raises(ConfigError, match=rf"layer '{re.escape(name)}' .*a block is not one contiguous page"):
        worker.register_kv_caches(split)
    # memory that is not 4096-byte aligned (O_DIRECT)
    raw = torch.zeros(shape.spec.page_size_bytes * shape.num_blocks * shape.layers + 8192, dtype=torch.int8)
    base = (-raw.data_ptr()) % 4096 + 64
    shifted = {}
    for i, n in enumerate(shape.layer_names):
        size = shape.spec.page_size_bytes * shape.num_blocks
        shifted[n] = raw[base + i * size:base + (i + 1) * size].view(torch.float16).view(caches[n].shape)
    with pytest.raises(ConfigError, match=r"must be a multiple of 4096 bytes \(O_DIRECT\)"):
        worker.register_kv_caches(shifted)
