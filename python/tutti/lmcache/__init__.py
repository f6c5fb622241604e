"""Tutti as an LMCache storage plugin: LMCache's KV chunks in Tutti's KV block store (docs/lmcache.md).

Enable it in LMCache's configuration (YAML shown; the same keys work in LMCacheEngineConfig):

    chunk_size: 256
    local_cpu: false                      # LMCache's CPU buffer stays the allocator, without hot copies
    max_local_cpu_size: 5                 # GB
    pre_caching_hash_algorithm: sha256_cbor
    storage_plugins: [tutti]
    extra_config:
      storage_plugin.tutti.module_path: tutti.lmcache
      storage_plugin.tutti.class_name: TuttiStorageBackend
      storage_plugin.tutti.path: /mnt/nvme/lmcache/rank-{rank}
      storage_plugin.tutti.capacity_gb: 500

The release of LMCache this plugin was written against is checked here, at import: LMCache 0.5.x
(tested with 0.5.6). Any other release raises ImportError naming the installed one.
"""

from __future__ import annotations

import importlib.metadata as _metadata

SUPPORTED_LMCACHE = "0.5"  # the minor release series this plugin follows
TESTED_LMCACHE = "0.5.6"


def _check_lmcache_release(installed: str | None) -> None:
    """Raises ImportError unless `installed` (lmcache's version string, None when absent) is 0.5.x."""
    if installed is None:
        raise ImportError(
            f"tutti.lmcache needs LMCache {SUPPORTED_LMCACHE}.x (tested with {TESTED_LMCACHE}); lmcache is not "
            f"installed (pip install lmcache=={TESTED_LMCACHE})"
        )
    parts = installed.split(".")
    if ".".join(parts[:2]) != SUPPORTED_LMCACHE:
        raise ImportError(
            f"tutti.lmcache supports LMCache {SUPPORTED_LMCACHE}.x (tested with {TESTED_LMCACHE}); the installed "
            f"lmcache is {installed}: its storage-plugin interface is not the one this plugin implements "
            f"(pip install lmcache=={TESTED_LMCACHE})"
        )


def _installed_lmcache() -> str | None:
    try:
        return _metadata.version("lmcache")
    except _metadata.PackageNotFoundError:
        return None


_check_lmcache_release(_installed_lmcache())

from ._settings import ConfigError, Settings, StartupRefused, check_config  # noqa: E402
from ._backend import TuttiStorageBackend  # noqa: E402

__all__ = [
    "ConfigError",
    "Settings",
    "StartupRefused",
    "SUPPORTED_LMCACHE",
    "TESTED_LMCACHE",
    "TuttiStorageBackend",
    "check_config",
]
