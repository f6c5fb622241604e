"""The connector's configuration (vLLM's ``kv_connector_extra_config``) and the engine facts it is
checked against, both as plain values: this module imports neither vLLM nor torch.

Every check runs at start-up (the connector's constructor and ``register_kv_caches``) and raises
``ConfigError`` naming the key (or the engine setting) and the value. docs/vllm.md lists every key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import string
from typing import Any, Mapping

#: The vLLM release this connector is written and tested against (docs/vllm.md).
SUPPORTED_VLLM = "0.33"

#: Layouts of vLLM's KV cache (``vllm/v1/kv_cache_layout.py``) whose block of one layer is one
#: contiguous page: L = layer, B = block, N = token, H = KV head, C = K then V of one head.
#: The store keeps a page as one piece; its byte order is the last three letters.
SUPPORTED_LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC")

#: KV cache dtypes stored byte for byte (``CacheConfig.cache_dtype``; "auto" is the model's dtype).
#: Formats that keep scales or indices inside the cache pages (fp8_ds_mla, the int8/int4 per-token
#: formats) are refused: their pages are not plain K and V.
SUPPORTED_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")

#: Hash algorithms whose NONE_HASH seed vLLM 0.33 draws at random per process when PYTHONHASHSEED is
#: unset (``vllm/v1/core/kv_cache_utils.py``, ``resolve_none_hash_seed``).
NON_CRYPTOGRAPHIC_HASHES = ("xxhash", "xxhash_cbor")

#: vLLM's fixed seed for the cryptographic algorithms (``DEFAULT_NONE_HASH_SEED``).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

#: The store's O_DIRECT and LBA alignment: every page must be a multiple of it (docs/kv-store.md).
PAGE_ALIGNMENT = 4096

BACKENDS = ("uring", "nvme-soft")
ROLES = ("kv_both", "kv_producer", "kv_consumer")


class ConfigError(ValueError):
    """A configuration the connector refuses at start-up; the message names the key and the value."""


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    """``kv_connector_extra_config``, validated. Defaults are the ``DEFAULTS`` table below."""

    path: str
    capacity_bytes: int
    backend: str = "uring"
    backend_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    lookahead_layers: int = 2
    verify_loads: bool = True
    io_timeout_s: float = 60.0
    host_checksum_threads: int = 0
    model_name: str | None = None
    record_calls: str | None = None

    def directory(self, rank: int, dp_rank: int = 0) -> str:
        """The store directory of tensor-parallel rank `rank` (and data-parallel index `dp_rank`)."""
        return self.path.format(rank=rank, dp_rank=dp_rank)


#: Every key with its default (``REQUIRED`` for the keys without one); docs/vllm.md prints this table
#: and python/tests/vllm/test_config.py checks that the two agree.
REQUIRED = object()
DEFAULTS: dict[str, Any] = {
    "path": REQUIRED,
    "capacity_bytes": REQUIRED,
    "backend": "uring",
    "backend_options": {},
    "lookahead_layers": 2,
    "verify_loads": True,
    "io_timeout_s": 60.0,
    "host_checksum_threads": 0,
    "model_name": None,
    "record_calls": None,
}

#: Keys that belong to vLLM's connector machinery and are passed through untouched.
PASS_THROUGH_KEYS = ("spec_name", "spec_module_path")


def _fail(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"kv_connector_extra_config.{key} = {value!r}: {why}")


def parse_config(extra: Mapping[str, Any] | None, *, allow: tuple[str, ...] = ()) -> ConnectorConfig:
    """Validates ``kv_connector_extra_config`` and returns it as a ``ConnectorConfig``.

    `allow` names further keys that belong to someone else (vLLM's offloading connector reads its
    own keys from the same dict) and are ignored. Raises ConfigError naming the key and the value.
    """
    extra = dict(extra or {})
    known = set(DEFAULTS) | set(PASS_THROUGH_KEYS) | set(allow)
    for key in extra:
        if key not in known:
            raise _fail(key, extra[key], "unknown key; the keys are " + ", ".join(sorted(DEFAULTS)))
    for key, default in DEFAULTS.items():
        if default is REQUIRED and key not in extra:
            raise ConfigError(f"kv_connector_extra_config.{key} is required (docs/vllm.md, Configuration)")

    path = extra["path"]
    if not isinstance(path, str) or not path:
        raise _fail("path", path, "must be a non-empty string (a directory; {rank} is the tensor-parallel rank)")
    if not os.path.isabs(path):
        raise _fail("path", path, "must be an absolute path (workers may run in another working directory)")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(path) if name is not None}
    except ValueError as e:
        raise _fail("path", path, f"is not a valid template: {e}") from None
    unknown = fields - {"rank", "dp_rank"}
    if unknown:
        raise _fail("path", path, f"has the placeholder {{{sorted(unknown)[0]}}}; only {{rank}} and {{dp_rank}} exist")

    capacity = extra["capacity_bytes"]
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise _fail("capacity_bytes", capacity, "must be a positive int (bytes of one rank's store, all layers)")

    backend = extra.get("backend", DEFAULTS["backend"])
    if backend not in BACKENDS:
        raise _fail("backend", backend, "must be one of " + ", ".join(BACKENDS))
    options = extra.get("backend_options", {})
    if not isinstance(options, Mapping):
        raise _fail("backend_options", options, "must be a dict of tutti.Runtime options (docs/python.md)")
    lookahead = extra.get("lookahead_layers", DEFAULTS["lookahead_layers"])
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
        raise _fail("lookahead_layers", lookahead, "must be an int >= 1 (layers loading ahead of compute)")
    verify = extra.get("verify_loads", DEFAULTS["verify_loads"])
    if not isinstance(verify, bool):
        raise _fail("verify_loads", verify, "must be true or false")
    timeout = extra.get("io_timeout_s", DEFAULTS["io_timeout_s"])
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise _fail("io_timeout_s", timeout, "must be a positive number of seconds")
    threads = extra.get("host_checksum_threads", DEFAULTS["host_checksum_threads"])
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= 64:
        raise _fail("host_checksum_threads", threads, "must be an int in 0..64 (0: the store's default)")
    model_name = extra.get("model_name")
    if model_name is not None and (not isinstance(model_name, str) or not model_name):
        raise _fail("model_name", model_name, "must be a non-empty string")
    record = extra.get("record_calls")
    if record is not None and (not isinstance(record, str) or not os.path.isabs(record)):
        raise _fail("record_calls", record, "must be an absolute path of a JSON file to write")
    return ConnectorConfig(path=path, capacity_bytes=capacity, backend=backend, backend_options=dict(options),
                           lookahead_layers=lookahead, verify_loads=verify, io_timeout_s=float(timeout),
                           host_checksum_threads=threads, model_name=model_name, record_calls=record)


@dataclasses.dataclass(frozen=True)
class EngineFacts:
    """What the connector needs to know about the engine, as plain values (the vLLM glue fills it from
    ``VllmConfig`` and ``KVCacheConfig``; the GPU replay fills it from a recording)."""

    model: str                     # model identity for the store's namespace (name@revision)
    kv_dtype: str                  # torch dtype name of the cache, e.g. "bfloat16"
    cache_dtype: str               # CacheConfig.cache_dtype as configured ("auto", "fp8", ...)
    block_size: int                # tokens per block
    num_kv_heads: int              # KV heads of this rank
    head_size: int                 # K head size (elements)
    head_size_v: int               # V head size (elements)
    page_bytes: int                # bytes of one block of one layer (the spec's page_size_bytes)
    layer_names: tuple[str, ...]   # attention layers, in the order compute reaches them
    kv_cache_layout: str           # resolved KVCacheLayout name, e.g. "LBNHC"
    spec_kind: str                 # the KV cache group's spec class, e.g. "FullAttentionSpec"
    kv_cache_groups: int           # number of KV cache groups (several: hybrid allocator)
    hash_algorithm: str            # CacheConfig.prefix_caching_hash_algo
    python_hash_seed: str | None   # PYTHONHASHSEED of the engine, None when unset
    tp_rank: int = 0
    tp_size: int = 1
    pp_size: int = 1
    dcp_size: int = 1
    pcp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "recompute"

    def with_rank(self, tp_rank: int) -> "EngineFacts":
        return dataclasses.replace(self, tp_rank=tp_rank)


def validate_engine(config: ConnectorConfig, facts: EngineFacts) -> None:
    """Refuses every engine setting the connector does not support; raises ConfigError naming it."""
    if facts.kv_role not in ROLES:
        raise ConfigError(f"kv_transfer_config.kv_role = {facts.kv_role!r}: must be one of " + ", ".join(ROLES))
    if facts.kv_load_failure_policy != "recompute" and facts.kv_role != "kv_producer":
        raise ConfigError(
            f"kv_transfer_config.kv_load_failure_policy = {facts.kv_load_failure_policy!r}: Tutti reports a load "
            "that fails or does not verify and vLLM must recompute those blocks; set "
            '"kv_load_failure_policy": "recompute" (vLLM\'s default "fail" fails the request)')
    check_hash_seed(facts.hash_algorithm, facts.python_hash_seed)
    if facts.pp_size != 1:
        raise ConfigError(f"parallel_config.pipeline_parallel_size = {facts.pp_size}: pipeline parallelism is not "
                          "supported by the Tutti connector (each stage would need its own layers' stores)")
    if facts.dcp_size != 1:
        raise ConfigError(f"parallel_config.decode_context_parallel_size = {facts.dcp_size}: decode context "
                          "parallelism is not supported (a block's tokens would be spread over ranks)")
    if facts.pcp_size != 1:
        raise ConfigError(f"parallel_config.prefill_context_parallel_size = {facts.pcp_size}: prefill context "
                          "parallelism is not supported")
    if facts.tp_size > 1 and "{rank}" not in config.path:
        raise ConfigError(f"kv_connector_extra_config.path = {config.path!r}: tensor_parallel_size = {facts.tp_size} "
                          "needs {rank} in the path (each rank has its own store)")
    if facts.dp_size > 1 and "{dp_rank}" not in config.path:
        raise ConfigError(f"kv_connector_extra_config.path = {config.path!r}: data_parallel_size = {facts.dp_size} "
                          "needs {dp_rank} in the path (each engine has its own stores)")
    if facts.kv_cache_groups != 1:
        raise ConfigError(f"kv_cache_config.kv_cache_groups = {facts.kv_cache_groups} groups: the hybrid KV cache "
                          "allocator (HMA) is not supported; the connector is not a SupportsHMA, so leave "
                          "--disable-hybrid-kv-cache-manager at its default or use a model with one group")
    if facts.spec_kind != "FullAttentionSpec":
        raise ConfigError(f"kv_cache_spec = {facts.spec_kind}: only full attention (FullAttentionSpec) is supported "
                          "(no sliding window, MLA or Mamba state)")
    if facts.cache_dtype not in SUPPORTED_CACHE_DTYPES:
        raise ConfigError(f"cache_config.cache_dtype = {facts.cache_dtype!r}: not supported; supported: "
                          + ", ".join(SUPPORTED_CACHE_DTYPES))
    if facts.kv_cache_layout not in SUPPORTED_LAYOUTS:
        raise ConfigError(f"kv_cache_layout = {facts.kv_cache_layout!r}: a block of one layer is not one contiguous "
                          "page in this layout; supported: " + ", ".join(SUPPORTED_LAYOUTS)
                          + " (VLLM_KV_CACHE_LAYOUT selects it)")
    if facts.page_bytes % PAGE_ALIGNMENT != 0:
        raise ConfigError(
            f"KV page = {facts.page_bytes} bytes (block_size {facts.block_size} x num_kv_heads {facts.num_kv_heads} x "
            f"(head_size {facts.head_size} + {facts.head_size_v}) x {facts.kv_dtype}): not a multiple of "
            f"{PAGE_ALIGNMENT} bytes, the store's O_DIRECT alignment; use a block_size that makes it one")
    if not facts.layer_names:
        raise ConfigError("kv_cache_config: no attention layers")


def layer_order(names) -> list[str]:
    """Layer names in the order compute reaches them: by the numbers in the name ("model.layers.10...")
    and then by name, so "layers.2" comes before "layers.10"."""
    def key(name: str):
        return ([int(part) for part in name.split(".") if part.isdigit()], name)
    return sorted(names, key=key)


def check_hash_seed(algorithm: str, python_hash_seed: str | None) -> None:
    """vLLM seeds non-cryptographic block hashes with random bytes per process when PYTHONHASHSEED is
    unset: a store would never hit again after a restart. Refuses that combination."""
    if algorithm in NON_CRYPTOGRAPHIC_HASHES and python_hash_seed is None:
        raise ConfigError(
            f"cache_config.prefix_caching_hash_algo = {algorithm!r} with PYTHONHASHSEED unset: vLLM seeds these "
            "block hashes with random bytes in every process, so the store would never be hit after a restart; "
            "set PYTHONHASHSEED (the same value for every engine sharing the store) or use sha256 / sha256_cbor")


def hash_seed_identity(algorithm: str, python_hash_seed: str | None) -> str:
    """The seed's identity for the namespace: a digest, not the seed (the xxhash seed must stay secret)."""
    seed = python_hash_seed if python_hash_seed is not None else DEFAULT_NONE_HASH_SEED
    if algorithm in NON_CRYPTOGRAPHIC_HASHES and python_hash_seed is None:
        raise ConfigError(f"hash seed of {algorithm!r} is random per process")  # check_hash_seed refused it first
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def namespace(config: ConnectorConfig, facts: EngineFacts, tp_rank: int | None = None) -> dict:
    """The store namespace (docs/kv-store.md) of tensor-parallel rank `tp_rank` (facts.tp_rank by default)."""
    rank = facts.tp_rank if tp_rank is None else tp_rank
    return {
        "model": config.model_name or facts.model,
        "dtype": facts.kv_dtype if facts.cache_dtype == "auto" else f"{facts.kv_dtype}/{facts.cache_dtype}",
        "tensor_layout": "NHD" if facts.kv_cache_layout.endswith("NHC") else "HND",
        "kv_split": False,      # one page holds K then V per (token, head) or per head: one piece
        "cross_layer": False,   # a piece never spans layers (a cross-layer allocation stores the same bytes)
        "tp_rank": rank,
        "tp_size": facts.tp_size,
        "pp_stage": 0,
        "pp_size": 1,
        "block_tokens": facts.block_size,
        "layers": len(facts.layer_names),
        "piece_bytes": [facts.page_bytes],
        "hash_algorithm": facts.hash_algorithm,
        "hash_seed": hash_seed_identity(facts.hash_algorithm, facts.python_hash_seed),
    }
