"""The plugin's settings, read from LMCacheEngineConfig.extra_config (docs/lmcache.md, "Settings").

LMCache 0.5.6 hands plugin settings over as flat dotted keys of `extra_config`:
`storage_plugin.<name>.<setting>`, where <name> is the entry of `storage_plugins` whose `module_path`
and `class_name` name this plugin. Every error is a ConfigError whose message names the key, the
value and the rule it breaks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import string
from typing import Any, Mapping

MODULE = "tutti.lmcache"
CLASS = "TuttiStorageBackend"

#: Settings read under storage_plugin.<name>. (module_path and class_name are LMCache's own).
KNOWN_KEYS = (
    "module_path",
    "class_name",
    "path",
    "capacity_gb",
    "backend",
    "verify_on_load",
    "queue_depth",
    "io_timeout_s",
    "nvme_soft.backing_path",
    "nvme_soft.block_device_path",
    "on_config_error",
)
BACKENDS = ("uring", "nvme-soft")
PLACEHOLDERS = ("rank", "local_rank", "world_size")
MAX_QUEUE_DEPTH = 32768  # the uring DataPath's limit (docs/uring.md)
MAX_IO_TIMEOUT_S = 3600.0
GIB = 1024**3  # LMCache's "GB" (max_local_disk_size, max_local_cpu_size) is 1024**3 bytes

# vLLM's cryptographic hash functions seed their NONE_HASH with a constant; the others (and Python's
# hash(), LMCache's "builtin") are seeded per process unless PYTHONHASHSEED is set
# (vllm/v1/core/kv_cache_utils.py: resolve_none_hash_seed; lmcache/v1/token_database.py).
STABLE_HASH_ALGORITHMS = ("sha256", "sha256_cbor")


class ConfigError(ValueError):
    """A setting the plugin refuses. `key` is the configuration key (an LMCache setting, an
    extra_config key or an environment variable), `value` its value; the message names both and
    the rule."""

    def __init__(self, key: str, value: Any, rule: str):
        self.key = key
        self.value = value
        super().__init__(f"{key} = {value!r}: {rule}")


class StartupRefused(SystemExit):
    """Raised by the plugin's constructor instead of ConfigError while on_config_error is "stop" (the
    default). LMCache 0.5.6 catches every Exception a plugin's constructor raises, logs it and starts
    without the plugin (lmcache/v1/storage_backend/__init__.py, storage_plugin_launcher); a
    SystemExit is not an Exception, so it stops LMCache's start-up, and a vLLM worker process that
    raises it exits with the message. `error` is the ConfigError."""

    def __init__(self, error: ConfigError):
        super().__init__(f"tutti.lmcache refused to start: {error}")
        self.error = error


@dataclasses.dataclass(frozen=True)
class Settings:
    """The plugin's settings after validation. Sizes in bytes, times in seconds."""

    name: str  #: the storage_plugins entry (keys are storage_plugin.<name>.*)
    path: str  #: the store's directory, placeholders substituted
    path_template: str  #: the path as configured
    capacity_bytes: int  #: byte bound of the store's data file (capacity_gb x 1024**3)
    capacity_gb: float  #: capacity_gb as configured (what errors quote)
    backend: str  #: "uring" or "nvme-soft"
    verify_on_load: bool  #: check every chunk's XXH3-64 before serving it
    queue_depth: int | None  #: uring submission queue depth (None: the runtime's default, 256)
    io_timeout_s: float  #: bound of every wait for IO
    nvme_soft_backing_path: str | None
    nvme_soft_block_device_path: str | None
    on_config_error: str  #: "stop" or "log"
    read_only: bool  #: LMCache's scheduler role: lookups only, the worker is the writer
    hash_algorithm: str  #: LMCache's pre_caching_hash_algorithm
    hash_seed: str  #: PYTHONHASHSEED ("" when unset)

    def key(self, setting: str) -> str:
        return f"storage_plugin.{self.name}.{setting}"


def plugin_name(config: Any) -> str:
    """The storage_plugins entry that names this plugin. ConfigError if none or several do."""
    extra = dict(config.extra_config or {})
    plugins = list(config.storage_plugins or [])
    names = [
        n
        for n in plugins
        if str(extra.get(f"storage_plugin.{n}.module_path", "")).startswith(MODULE)
        and extra.get(f"storage_plugin.{n}.class_name") == CLASS
    ]
    if not names:
        raise ConfigError(
            "storage_plugins",
            plugins,
            f"no entry <name> has extra_config storage_plugin.<name>.module_path = '{MODULE}' and "
            f"storage_plugin.<name>.class_name = '{CLASS}'",
        )
    if len(names) > 1:
        raise ConfigError(
            "storage_plugins", plugins, f"{names} all name {MODULE}.{CLASS}; one Tutti store per LMCache engine"
        )
    return names[0]


def _typed(key: str, value: Any, kind: str) -> Any:
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "must be true or false")
    if kind == "str":
        if isinstance(value, str) and value:
            return value
        raise ConfigError(key, value, "must be a non-empty string")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(key, value, "must be an integer")
    if kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(key, value, "must be a finite number")
    raise AssertionError(kind)


def substitute_rank(template: str, key: str, metadata: Any) -> str:
    """`template` with {rank}, {local_rank} and {world_size} replaced from LMCache's metadata."""
    values = {
        "rank": int(metadata.worker_id),
        "local_rank": int(metadata.local_worker_id),
        "world_size": int(metadata.world_size),
    }
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(key, template, f"is not a valid template ({e}); placeholders: {{rank}}, {{local_rank}}, "
                          "{world_size}; write a literal brace as {{ or }}") from None
    for f in fields:
        if f not in PLACEHOLDERS:
            raise ConfigError(key, template, f"unknown placeholder {{{f}}}; known: {{rank}}, {{local_rank}}, "
                              "{world_size}")
    if values["world_size"] > 1 and "rank" not in fields and "local_rank" not in fields:
        raise ConfigError(
            key,
            template,
            f"LMCache runs {values['world_size']} workers (world_size) and each needs its own store: put "
            "{rank} (or {local_rank} when every node has its own disk) in the path",
        )
    return template.format(**values)


def hash_problem(algorithm: str, environ: Mapping[str, str]) -> str | None:
    """Why LMCache's chunk keys would differ between processes with these settings, or None."""
    seed = environ.get("PYTHONHASHSEED", "")
    if seed not in ("", "random"):
        return None
    if algorithm not in STABLE_HASH_ALGORITHMS:
        return (
            f"LMCache's chunk keys from pre_caching_hash_algorithm = '{algorithm}' are seeded per process while "
            "PYTHONHASHSEED is unset, so no process would ever hit the chunks another one stored (a restart "
            "loses the whole store); set pre_caching_hash_algorithm: sha256_cbor, or export PYTHONHASHSEED in "
            "every process"
        )
    if importlib.util.find_spec("vllm") is None:
        return (
            f"pre_caching_hash_algorithm = '{algorithm}' comes from vLLM, which is not importable here: LMCache "
            "falls back to Python's hash(), seeded per process while PYTHONHASHSEED is unset; export "
            "PYTHONHASHSEED in every process"
        )
    return None


def check_config(config: Any, metadata: Any, *, environ: Mapping[str, str] | None = None) -> Settings:
    """Validates the plugin's settings in an LMCacheEngineConfig against LMCacheMetadata, without
    touching the disk, and returns them. The plugin's constructor calls it first; call it yourself
    to check a configuration before starting an engine (LMCache itself calls no validation hook).

    Raises ConfigError naming the key: an unknown storage_plugin.<name>.* key, a missing or malformed
    path, capacity_gb <= 0, an unknown backend, nvme-soft without its two paths, a wrong type, an
    unstable chunk hash (pre_caching_hash_algorithm with PYTHONHASHSEED unset), use_layerwise (not
    supported), max_local_cpu_size <= 0 in a worker.
    """
    environ = os.environ if environ is None else environ
    if config is None or metadata is None:
        raise ConfigError("config" if config is None else "metadata", None,
                          "LMCache passed no configuration or metadata to the plugin")
    name = plugin_name(config)
    extra = dict(config.extra_config or {})
    prefix = f"storage_plugin.{name}."

    def key(setting: str) -> str:
        return prefix + setting

    for k in extra:
        if k.startswith(prefix) and k[len(prefix):] not in KNOWN_KEYS:
            raise ConfigError(k, extra[k], f"unknown setting; known: {', '.join(prefix + s for s in KNOWN_KEYS)}")

    def get(setting: str, kind: str, default: Any = None, required: bool = False) -> Any:
        k = key(setting)
        if k not in extra or extra[k] is None:
            if required:
                raise ConfigError(k, None, "is required")
            return default
        return _typed(k, extra[k], kind)

    on_config_error = get("on_config_error", "str", "stop")
    if on_config_error not in ("stop", "log"):
        raise ConfigError(key("on_config_error"), on_config_error,
                          "must be 'stop' (refuse to start) or 'log' (LMCache's way: log and start without the "
                          "plugin)")

    template = get("path", "str", required=True)
    path = substitute_rank(template, key("path"), metadata)
    if not os.path.isabs(path):
        raise ConfigError(key("path"), template, "must be an absolute path")

    capacity_gb = get("capacity_gb", "number", required=True)
    if capacity_gb <= 0:
        raise ConfigError(key("capacity_gb"), capacity_gb, "must be > 0 (GB of 1024**3 bytes, LMCache's unit)")
    capacity_bytes = int(capacity_gb * GIB)

    backend = get("backend", "str", "uring")
    if backend not in BACKENDS:
        raise ConfigError(key("backend"), backend, f"must be one of {', '.join(BACKENDS)}")

    verify_on_load = get("verify_on_load", "bool", True)

    queue_depth = get("queue_depth", "int")
    if queue_depth is not None:
        if backend != "uring":
            raise ConfigError(key("queue_depth"), queue_depth, "applies to backend 'uring' only")
        if not 1 <= queue_depth <= MAX_QUEUE_DEPTH:
            raise ConfigError(key("queue_depth"), queue_depth, f"must be in 1..{MAX_QUEUE_DEPTH}")

    io_timeout_s = get("io_timeout_s", "number", 60.0)
    if not 0 < io_timeout_s <= MAX_IO_TIMEOUT_S:
        raise ConfigError(key("io_timeout_s"), io_timeout_s, f"must be in (0, {MAX_IO_TIMEOUT_S:g}] seconds")

    backing = get("nvme_soft.backing_path", "str")
    block_device = get("nvme_soft.block_device_path", "str")
    if backend == "nvme-soft":
        if backing is None:
            raise ConfigError(key("nvme_soft.backing_path"), None, "is required with backend 'nvme-soft' (the ext4 "
                              "image or block device the soft controller serves)")
        if block_device is None:
            raise ConfigError(key("nvme_soft.block_device_path"), None, "is required with backend 'nvme-soft' (the "
                              "block device the store's file system is mounted from)")
    elif backing is not None or block_device is not None:
        k = key("nvme_soft.backing_path") if backing is not None else key("nvme_soft.block_device_path")
        raise ConfigError(k, backing if backing is not None else block_device, "applies to backend 'nvme-soft' only")

    algorithm = str(config.pre_caching_hash_algorithm)
    problem = hash_problem(algorithm, environ)
    if problem is not None:
        raise ConfigError("pre_caching_hash_algorithm", algorithm, problem)

    if config.use_layerwise:
        raise ConfigError("use_layerwise", True, "layer-wise chunks (LayerCacheEngineKey, KV_T2D) are not supported "
                          "by this plugin; it stores whole chunks (KV_2LTD, KV_MLA_FMT)")

    read_only = getattr(metadata, "role", None) == "scheduler"
    if not read_only and not config.max_local_cpu_size > 0:
        raise ConfigError("max_local_cpu_size", config.max_local_cpu_size,
                          "must be > 0: the plugin reads chunks into LMCache's CPU buffer (local_cpu: false keeps it "
                          "as a buffer only)")

    seed = environ.get("PYTHONHASHSEED", "")
    return Settings(
        name=name,
        path=path,
        path_template=template,
        capacity_bytes=capacity_bytes,
        capacity_gb=capacity_gb,
        backend=backend,
        verify_on_load=verify_on_load,
        queue_depth=queue_depth,
        io_timeout_s=io_timeout_s,
        nvme_soft_backing_path=backing,
        nvme_soft_block_device_path=block_device,
        on_config_error=on_config_error,
        read_only=read_only,
        hash_algorithm=algorithm,
        hash_seed="" if seed == "random" else seed,
    )
