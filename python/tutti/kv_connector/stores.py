"""Stores of one process: the writer of each rank this process runs, and read-only views of the other
ranks' stores for the scheduler's lookups.

LMDB allows one open of an environment per process (docs/kv-store.md, "Threads and processes"), and
vLLM may run the scheduler and a worker in one process (one GPU, the uniprocess executor). So a
directory is opened once per process: a lookup uses this process's writer when there is one, and a
read-only open otherwise; opening the writer closes a read-only open of the same directory first.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

import tutti

from .config import ConfigError, ConnectorConfig

_lock = threading.RLock()  # lookup() opens a runtime while holding it
_runtimes: dict[tuple, tutti.Runtime] = {}
_writers: dict[str, tutti.KvStore] = {}
_readers: dict[str, tutti.KvStore] = {}


def _key(directory: str) -> str:
    return os.path.realpath(directory)


def runtime(backend: str, options: Mapping[str, Any]) -> tutti.Runtime:
    """This process's runtime for `backend` with `options` (created once, shared by its stores)."""
    key = (backend, tuple(sorted((k, repr(v)) for k, v in options.items())))
    with _lock:
        rt = _runtimes.get(key)
        if rt is None:
            try:
                rt = tutti.Runtime(backend, **dict(options))
            except tutti.Error as e:
                raise ConfigError(f"kv_connector_extra_config.backend = {backend!r}, backend_options = "
                                  f"{dict(options)!r}: {e}") from None
            _runtimes[key] = rt
        return rt


def open_writer(config: ConnectorConfig, directory: str, name_space: dict) -> tutti.KvStore:
    """Opens (or creates) the store of this rank as its writer. Raises ConfigError naming `path` when the
    directory cannot hold a store (not a directory, no O_DIRECT, another writer, another namespace)."""
    rt = runtime(config.backend, config.backend_options)
    key = _key(directory)
    with _lock:
        if key in _writers:
            raise ConfigError(f"kv_connector_extra_config.path = {config.path!r}: {directory} is already open as "
                              "a writer in this process (two ranks with one directory: put {rank} in the path)")
        reader = _readers.pop(key, None)
        if reader is not None:
            reader.close()
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ConfigError(f"kv_connector_extra_config.path = {config.path!r}: {directory} exists and is not "
                              "a directory")
        try:
            os.makedirs(os.path.dirname(directory), exist_ok=True)
        except OSError as e:
            raise ConfigError(f"kv_connector_extra_config.path = {config.path!r}: cannot create the parent of "
                              f"{directory}: {e.strerror} ({e.filename})") from None
        try:
            store = tutti.KvStore(rt, directory, name_space, capacity_bytes=config.capacity_bytes,
                                  unsafe_skip_verification=not config.verify_loads,
                                  io_timeout_s=config.io_timeout_s,
                                  host_checksum_threads=config.host_checksum_threads)
        except tutti.Error as e:
            raise ConfigError(f"kv_connector_extra_config.path = {config.path!r} ({directory}), capacity_bytes = "
                              f"{config.capacity_bytes}: the store cannot be opened: {e}") from None
        _writers[key] = store
        return store


def close_writer(directory: str) -> None:
    with _lock:
        store = _writers.pop(_key(directory), None)
    if store is not None:
        store.close()


def lookup(config: ConnectorConfig, directory: str, name_space: dict, keys: list[bytes]) -> int:
    """The stored prefix of `keys` (in blocks) in the store at `directory`: through this process's
    writer of it, or a read-only open. A store that does not exist yet has no blocks (0). A namespace
    that differs from the stored one raises ConfigError naming `path`."""
    if not keys:
        return 0
    key = _key(directory)
    with _lock:
        store = _writers.get(key) or _readers.get(key)
        if store is None:
            if not os.path.isdir(directory):
                return 0
            rt = runtime("uring", {})  # lookups read only the index: any file system, no IO
            try:
                store = tutti.KvStore(rt, directory, name_space, read_only=True, io_timeout_s=config.io_timeout_s)
            except tutti.NotFound:
                return 0  # the worker has not created it yet
            except tutti.InvalidArgument as e:
                raise ConfigError(f"kv_connector_extra_config.path = {config.path!r} ({directory}): {e}") from None
            _readers[key] = store
        return store.lookup(keys)


def close_all() -> None:
    """Closes every store and runtime of this process (tests; the connectors' shutdown)."""
    with _lock:
        stores = list(_writers.values()) + list(_readers.values())
        runtimes = list(_runtimes.values())
        _writers.clear(), _readers.clear(), _runtimes.clear()
    for store in stores:
        store.close()
    for rt in runtimes:
        rt.shutdown()
