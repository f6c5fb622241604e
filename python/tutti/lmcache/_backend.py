"""tutti.lmcache.TuttiStorageBackend: LMCache 0.5.x storage plugin over tutti.KvStore (docs/lmcache.md).

How LMCache's objects map to the store (docs/kv-store.md):
- One LMCache chunk (a MemoryObj: KV_2LTD [2, layers, tokens, heads x head_size] or KV_MLA_FMT) is
  one block of a store with ONE "layer" (cross_layer: the chunk spans every model layer), keyed by
  SHA-256 of the CacheEngineKey's string (model, world size, worker, chunk hash, dtype, tags).
- A block is a 4096-byte header piece (the key's string, memory format, shapes, dtypes and byte
  count, so a get can check that the bytes are the chunk that was asked for and learn the length of
  an unfull last chunk) and P data pieces of at most the runtime's request size (64 MiB for uring):
  P = 1 up to 64 MiB chunks (an 8B model's 256-token chunk is 32 MiB).
- A batch of chunks (batched_submit_put_task, batched_get_blocking) is ONE store()/load() call,
  which is ONE runtime submit of every piece of every chunk (split only past the runtime's
  max_batch_requests, 8192 requests). The uring DataPath splits each piece into 1 MiB commands
  and keeps its whole queue (256 by default) busy, with O_DIRECT.
- Pieces are views of LMCache's own MemoryObjs: the allocator's arena (LocalCPUBackend's pinned
  buffer) is registered with the store once, so nothing is copied on the way to or from the disk.
  An object the store cannot take directly (not 4096-byte aligned, a CUDA tensor in a host build,
  memory that cannot be registered) goes through a registered staging buffer (one copy), counted
  in statistics()["staged_chunks"] and logged once.
- Puts are asynchronous: a worker thread stores each batch, waits for it and commits it (flush of the
  data file, then one synced index transaction); only then does contains() see the chunks. The
  plugin holds a reference on every object it keeps (LMCache drops its own right after the call).
- Gets verify every chunk (XXH3-64 of every piece, then the header against the key). A chunk that
  fails is a miss (None), never wrong bytes; a chunk that fails its checksum is evicted.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import os
import struct
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import torch

from lmcache.logging import init_logger
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

import tutti

from ._settings import ConfigError, Settings, StartupRefused, check_config

logger = init_logger("tutti.lmcache")

ALIGNMENT = 4096  # O_DIRECT, the store's piece alignment (docs/kv-store.md, "Limits")
HEADER_BYTES = 4096
HEADER_MAGIC = b"TUTTI-LMCACHE-01"  # 16 bytes; then u32 JSON length, u32 0, then the JSON
HEADER_FIXED = struct.Struct("<16sII")
HEADER_POOL_ROWS = 64  # header slots registered at a time


def round_up(n: int, to: int = ALIGNMENT) -> int:
    return (n + to - 1) // to * to


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return value


def size_of(shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype]) -> int:
    return sum(math.prod(s) * d.itemsize for s, d in zip(shapes, dtypes, strict=True))


class ChunkLayout:
    """Where a chunk's bytes go: a header piece, then P data pieces of S bytes (the last shorter)."""

    def __init__(self, data_bytes: int, max_piece_bytes: int):
        if data_bytes <= 0:
            raise ValueError(f"data_bytes = {data_bytes} must be > 0")
        max_piece = max_piece_bytes // ALIGNMENT * ALIGNMENT
        self.data_bytes = data_bytes
        self.pieces = max(1, math.ceil(data_bytes / max_piece))
        self.piece = round_up(math.ceil(data_bytes / self.pieces))  # S, a multiple of 4096
        last = data_bytes - (self.pieces - 1) * self.piece
        assert last > 0
        self.piece_bytes = [HEADER_BYTES] + [self.piece] * (self.pieces - 1) + [last]

    @property
    def slot_bytes(self) -> int:
        return sum(round_up(b) for b in self.piece_bytes)

    def data_pieces(self, n: int) -> list[tuple[int, int]]:
        """(offset, length) of each data piece of an n-byte chunk; length 0 = a padding piece (an
        unfull chunk that ends before piece p; 1 byte of zeros is stored so the block has every
        piece)."""
        return [(p * self.piece, max(0, min(self.piece, n - p * self.piece))) for p in range(self.pieces)]

    def full_pieces(self) -> list[tuple[int, int]]:
        return [(p * self.piece, self.piece_bytes[1 + p]) for p in range(self.pieces)]


class _Pool:
    """Registered 4096-byte rows (chunk headers), taken and given back by batches."""

    def __init__(self, store: Any):
        self._store = store
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> list[torch.Tensor]:
        if n <= 0:
            return []
        with self._lock:
            while len(self._free) < n:
                rows = tutti.empty((max(HEADER_POOL_ROWS, n), HEADER_BYTES), torch.uint8)
                self._store.register(rows)
                self._free.extend(rows[i] for i in range(rows.shape[0]))
            taken = self._free[-n:]
            del self._free[-n:]
            return taken

    def give(self, rows: list[torch.Tensor]) -> None:
        with self._lock:
            self._free.extend(rows)


class _Batch:
    """One store() or load() of several chunks: the keys, the pieces, and what to undo after."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.pieces: list[torch.Tensor] = []
        self.headers: list[torch.Tensor] = []
        self.staging: list[tuple[int, torch.Tensor, int]] = []  # (chunk index, staging tensor, bytes)
        self.index: list[int] = []  # the chunk index of each key


def error_mode(config: Any) -> str:
    """on_config_error as configured ("stop" unless exactly "log"); never raises."""
    try:
        extra = dict(config.extra_config or {})
        for name in config.storage_plugins or []:
            if extra.get(f"storage_plugin.{name}.class_name") == "TuttiStorageBackend":
                if extra.get(f"storage_plugin.{name}.on_config_error") == "log":
                    return "log"
    except Exception:  # noqa: BLE001 - a malformed config is reported by check_config
        pass
    return "stop"


def stop_event_loop(loop: Any) -> None:
    """Stops LMCache's storage-manager event loop before a refused start-up propagates. LMCache 0.5.6
    runs that loop in a non-daemon thread it starts before it builds its backends
    (StorageManager.__init__); nothing else stops it once the constructor fails, so the process
    would never exit after StartupRefused (checked: the interpreter waits for that thread)."""
    if loop is None:
        return
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # already closed
        pass


class TuttiStorageBackend(StoragePluginInterface):
    """LMCache storage plugin keeping chunks in a tutti.KvStore (docs/lmcache.md).

    Constructed by LMCache (storage_plugin_launcher) with keywords config, dst_device, metadata,
    local_cpu_backend and loop. Raises StartupRefused (on_config_error: stop, the default) or
    ConfigError (on_config_error: log) for a bad setting, naming the key; see check_config.

    Thread-safety: every method may be called from any thread (LMCache's store, retrieve and
    event-loop threads call it concurrently).
    """

    def __init__(
        self,
        dst_device: str = "cpu",
        config: Any = None,
        metadata: Any = None,
        local_cpu_backend: Any = None,
        loop: Any = None,
    ):
        super().__init__(
            dst_device=dst_device, config=config, metadata=metadata, local_cpu_backend=local_cpu_backend, loop=loop
        )
        self._runtime = None
        self._store = None
        self._closed = False
        self._lock = threading.Lock()
        self._pending: dict[bytes, Any] = {}  # store key -> CacheEngineKey, puts not yet committed
        self._futures: set[concurrent.futures.Future] = set()
        self._regions: dict[tuple[str, int], Optional[tuple[int, int]]] = {}  # (device, base) -> span or None
        self._warned: set[str] = set()
        self._stats = {
            "put_chunks": 0,
            "put_bytes": 0,
            "put_failures": 0,
            "put_skipped": 0,
            "get_chunks": 0,
            "get_hits": 0,
            "get_misses": 0,
            "get_bytes": 0,
            "rejected_chunks": 0,
            "staged_chunks": 0,
            "evicted_damaged": 0,
        }
        try:
            self.settings = check_config(config, metadata)
            self._open()
        except ConfigError as e:
            self._release()
            if error_mode(config) == "stop":
                stop_event_loop(loop)
                raise StartupRefused(e) from None
            raise
        except BaseException:
            self._release()
            raise
        self._put_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tutti-lmcache-put")
        self._get_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tutti-lmcache-get")
        self._hook_allocator_close()
        logger.info(
            "tutti.lmcache: store %s (%s, %.1f GiB, %d-byte chunks in %d piece(s), verify_on_load=%s%s)",
            self.settings.path,
            self.settings.backend,
            self.settings.capacity_bytes / 1024**3,
            self.layout.data_bytes,
            self.layout.pieces,
            self.settings.verify_on_load,
            ", read-only (scheduler)" if self.settings.read_only else "",
        )

    # ------------------------------------------------------------------------------------------ setup

    def _open(self) -> None:
        s: Settings = self.settings
        config, metadata = self.config, self.metadata
        self.fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD
        self.chunk_tokens = int(config.chunk_size)
        self.full_shapes = [torch.Size(x) for x in metadata.get_shapes(self.chunk_tokens)]
        self.full_dtypes = list(metadata.get_dtypes())
        options: dict[str, Any] = {}
        if s.backend == "uring" and s.queue_depth is not None:
            options["queue_depth"] = s.queue_depth
        if s.backend == "nvme-soft":
            options["backing_path"] = s.nvme_soft_backing_path
            options["block_device_path"] = s.nvme_soft_block_device_path
        if s.backend not in tutti.build_info()["backends"]:
            raise ConfigError(s.key("backend"), s.backend,
                              f"this build of tutti has backends {tutti.build_info()['backends']}")
        try:
            self._runtime = tutti.Runtime(s.backend, **options)
        except tutti.Error as e:
            raise ConfigError(s.key("backend"), s.backend, f"the runtime did not start: {e}") from None
        self.layout = ChunkLayout(size_of(self.full_shapes, self.full_dtypes), self._runtime.max_request_bytes)
        self._max_keys_per_submit = max(1, self._runtime.max_batch_requests // len(self.layout.piece_bytes))
        if s.capacity_bytes < self.layout.slot_bytes:
            raise ConfigError(s.key("capacity_gb"), s.capacity_gb,
                              f"holds no chunk: one chunk takes {self.layout.slot_bytes} bytes "
                              f"({self.chunk_tokens} tokens of {self.full_shapes} {self.full_dtypes})")
        self.namespace = {
            "model": f"{metadata.model_name}|lmcache:{self.fmt.name}:"
            + ";".join(f"{list(x)}{dtype_name(d)}" for x, d in zip(self.full_shapes, self.full_dtypes)),
            "dtype": ",".join(dtype_name(d) for d in self.full_dtypes),
            "tensor_layout": "NHD",
            "kv_split": False,
            "cross_layer": True,
            "tp_rank": int(metadata.worker_id),
            "tp_size": int(metadata.world_size),
            "block_tokens": self.chunk_tokens,
            "layers": 1,
            "piece_bytes": self.layout.piece_bytes,
            "hash_algorithm": f"lmcache:{s.hash_algorithm}",
            "hash_seed": s.hash_seed,
        }
        if s.read_only:
            self._try_open_reader()
            return
        parent = os.path.dirname(os.path.normpath(s.path))
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise ConfigError(s.key("path"), s.path_template, f"cannot create {parent}: {e.strerror}") from None
        self._store = self._open_store(read_only=False)
        self._headers = _Pool(self._store)
        self._zero = self._store.register(tutti.empty(ALIGNMENT, torch.uint8).zero_())

    def _open_store(self, read_only: bool) -> Any:
        s = self.settings
        try:
            return tutti.KvStore(
                self._runtime,
                s.path,
                self.namespace,
                capacity_bytes=0 if read_only else s.capacity_bytes,
                read_only=read_only,
                unsafe_skip_verification=not s.verify_on_load,
                io_timeout_s=s.io_timeout_s,
            )
        except tutti.ResourceExhausted as e:
            raise ConfigError(s.key("capacity_gb"), s.capacity_gb, str(e)) from None
        except tutti.InvalidArgument as e:
            text = str(e)
            if "capacity" in text:
                raise ConfigError(s.key("capacity_gb"), s.capacity_gb,
                                  f"the store at {s.path} was created with another capacity (no resizing): {text}")
            raise ConfigError(s.key("path"), s.path_template,
                              f"the store at {s.path} was written by another LMCache configuration (model, "
                              f"chunk_size, KV shape or dtype, pre_caching_hash_algorithm, PYTHONHASHSEED, "
                              f"rank): {text}") from None
        except tutti.Busy as e:
            raise ConfigError(s.key("path"), s.path_template,
                              f"another process is the writer of {s.path}: {e}") from None
        except tutti.Error as e:
            raise ConfigError(s.key("path"), s.path_template, f"the store at {s.path} cannot open: {e}") from None

    def _try_open_reader(self) -> bool:
        """The scheduler role opens the worker's store read-only once the worker created it."""
        if self._store is not None:
            return True
        try:
            self._store = self._open_store(read_only=True)
        except ConfigError as e:
            if not os.path.exists(os.path.join(self.settings.path, "index.mdb")):
                return False  # not created yet: lookups miss until the worker has made it
            raise e
        return True

    def _hook_allocator_close(self) -> None:
        """LMCache 0.5.6's StorageManager.close() closes LocalCPUBackend (and frees its CPU arena)
        BEFORE the plugins; puts of ours may still be writing from that arena. Its close() is made to
        wait for them first, and to leave the arena allocated if they do not finish in time."""
        backend = self.local_cpu_backend
        if backend is None or self.settings.read_only:
            return
        original = backend.close

        def close_after_tutti() -> None:
            if not self._drain(self.settings.io_timeout_s):
                logger.error(
                    "tutti.lmcache: puts still in flight after %.0f s; LMCache's CPU buffer is left allocated "
                    "rather than freed under IO", self.settings.io_timeout_s)
                return
            original()

        backend.close = close_after_tutti

    # ------------------------------------------------------------------------------------ small utils

    @staticmethod
    def store_key(key: Any) -> bytes:
        """The store's key of an LMCache CacheEngineKey: SHA-256 of key.to_string()."""
        return hashlib.sha256(key.to_string().encode()).digest()

    def _warn_once(self, what: str, message: str, *args: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(message, *args)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def statistics(self) -> dict:
        """The plugin's counters and the store's (docs/lmcache.md, "Statistics")."""
        with self._lock:
            out = dict(self._stats)
            out["pending_puts"] = len(self._pending)
        if self._store is not None:
            out["store"] = self._store.statistics()
        return out

    def _direct(self, tensor: torch.Tensor, length: int) -> Optional[torch.Tensor]:
        """`tensor[:length]` as a view the store can move without a copy, or None: the data must start
        on 4096 bytes and lie, rounded up to 4096, inside a tensor registered with the store."""
        if tensor.data_ptr() % ALIGNMENT:
            return None
        base = tensor
        while base._base is not None:  # the allocation the view was cut from (LMCache's arena)
            base = base._base
        region_key = (str(base.device), base.data_ptr())
        with self._lock:
            span = self._regions.get(region_key, ())
        if span == ():
            span = None
            try:
                flat = base.view(torch.uint8).reshape(-1) if base.is_contiguous() else None
                if flat is not None:
                    skip = (-flat.data_ptr()) % ALIGNMENT
                    usable = (flat.numel() - skip) // ALIGNMENT * ALIGNMENT
                    if usable > 0:
                        self._store.register(flat[skip : skip + usable])
                        span = (flat.data_ptr() + skip, flat.data_ptr() + skip + usable)
            except (tutti.Error, RuntimeError) as e:
                self._warn_once(f"register-{base.device}", "tutti.lmcache: LMCache's %s memory cannot be registered "
                                "(%s); its chunks go through a staging copy", base.device, e)
                span = None
            with self._lock:
                self._regions[region_key] = span
        if span is None:
            return None
        start = tensor.data_ptr()
        if start < span[0] or start + round_up(length) > span[1]:
            return None
        return tensor[:length] if length <= tensor.numel() else None

    def _raw(self, obj: MemoryObj) -> torch.Tensor:
        raw = obj.raw_tensor
        if raw is None:
            raise ValueError("the MemoryObj was invalidated")
        if raw.dtype != torch.uint8:
            raw = raw.view(torch.uint8)
        return raw if raw.dim() == 1 else raw.reshape(-1)

    def _header(self, row: torch.Tensor, key: Any, obj: MemoryObj, n: int) -> bool:
        body = json.dumps({
            "key": key.to_string(),
            "fmt": obj.get_memory_format().name,
            "shapes": [list(s) for s in obj.get_shapes()],
            "dtypes": [dtype_name(d) for d in obj.get_dtypes()],
            "bytes": n,
        }, separators=(",", ":")).encode()
        if HEADER_FIXED.size + len(body) > HEADER_BYTES:
            return False
        row.zero_()
        data = HEADER_FIXED.pack(HEADER_MAGIC, len(body), 0) + body
        row[: len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return True

    def _read_header(self, row: torch.Tensor) -> Optional[dict]:
        fixed = bytes(row[: HEADER_FIXED.size].numpy())
        magic, length, _ = HEADER_FIXED.unpack(fixed)
        if magic != HEADER_MAGIC or length > HEADER_BYTES - HEADER_FIXED.size:
            return None
        try:
            return json.loads(bytes(row[HEADER_FIXED.size : HEADER_FIXED.size + length].numpy()))
        except ValueError:
            return None

    # ------------------------------------------------------------------------------------------- puts

    def exists_in_put_tasks(self, key: Any) -> bool:
        with self._lock:
            return self.store_key(key) in self._pending

    def batched_submit_put_task(
        self,
        keys: Sequence[Any],
        objs: List[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Optional[Callable[[Any], None]] = None,
    ) -> Optional[list[concurrent.futures.Future]]:
        """Starts storing the chunks; returns at once with one Future for the batch (None when
        nothing is to be stored). A chunk becomes visible to contains() once its bytes and index
        record are durable; on_complete_callback(key) is called then, for each stored key."""
        if self._store is None or self._closed or self.settings.read_only:
            return None
        items = []
        with self._lock:
            for key, obj in zip(keys, objs, strict=True):
                h = self.store_key(key)
                if h in self._pending:
                    continue
                self._pending[h] = key
                items.append((key, h, obj))
        if items:
            visible = self._visible([h for _, h, _ in items])
            skipped = [it for it, v in zip(items, visible) if v]
            if skipped:
                with self._lock:
                    for _, h, _ in skipped:
                        self._pending.pop(h, None)
                items = [it for it, v in zip(items, visible) if not v]
        if not items:
            return None
        for _, _, obj in items:
            obj.ref_count_up()  # LMCache drops its reference when this call returns
        try:
            future = self._put_executor.submit(self._put_batch, items, on_complete_callback)
        except RuntimeError:  # executor shut down: closing
            self._finish_puts(items)
            return None
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget_future)
        return [future]

    def _forget_future(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._futures.discard(future)

    def _visible(self, hkeys: list[bytes]) -> list[bool]:
        return [self._store.lookup([h]) == 1 for h in hkeys]

    def _finish_puts(self, items: list) -> None:
        for _, h, obj in items:
            obj.ref_count_down()
        with self._lock:
            for _, h, _ in items:
                self._pending.pop(h, None)

    def _put_batch(self, items: list, callback: Optional[Callable[[Any], None]]) -> int:
        """Worker thread: store, wait, commit; returns the number of chunks made visible."""
        stored = 0
        keep: list = []  # items whose IO did not finish: their memory stays referenced
        try:
            for start in range(0, len(items), self._max_keys_per_submit):
                part = items[start : start + self._max_keys_per_submit]
                stored += self._put_part(part, callback, keep)
        except Exception:  # noqa: BLE001 - a put must never take LMCache down
            logger.exception("tutti.lmcache: a batch of %d puts failed", len(items))
        finally:
            self._finish_puts([it for it in items if not any(it is k for k in keep)])
        return stored

    def _put_part(self, items: list, callback: Optional[Callable[[Any], None]], keep: list) -> int:
        batch = _Batch()
        rows = self._headers.take(len(items))
        batch.headers = rows
        try:
            for i, (key, h, obj) in enumerate(items):
                if not self._add_put(batch, i, key, h, obj, rows[i]):
                    self._count("put_skipped")
            if not batch.keys:
                return 0
            try:
                io = self._store.store(batch.keys, 0, batch.pieces)
            except tutti.Error as e:
                logger.error("tutti.lmcache: store of %d chunks refused: %s", len(batch.keys), e)
                self._count("put_failures", len(batch.keys))
                return 0
            try:
                result = self._store.wait(io, timeout_s=self.settings.io_timeout_s, check=False)
            except tutti.TimeoutError:
                logger.error("tutti.lmcache: %d puts did not complete in %.0f s; their memory stays referenced",
                             len(batch.keys), self.settings.io_timeout_s)
                keep.extend(items)
                rows = []  # still in flight: the header rows stay taken
                return 0
            committed = self._store.commit(batch.keys, timeout_s=self.settings.io_timeout_s, check=False)
            visible = 0
            for k, (block, done) in enumerate(zip(result.blocks, committed)):
                key, _, obj = items[batch.index[k]]
                if block.ok and done.status in (tutti.StatusCode.OK,):
                    visible += 1
                    self._count("put_bytes", obj.get_size())
                    if callback is not None:
                        try:
                            callback(key)
                        except Exception as e:  # noqa: BLE001
                            logger.warning("tutti.lmcache: on_complete_callback failed for %s: %s", key, e)
                else:
                    self._count("put_failures")
                    why = block.message if not block.ok else done.message
                    logger.warning("tutti.lmcache: chunk %s not stored: %s", key.to_string(), why)
            self._count("put_chunks", visible)
            return visible
        finally:
            for _, staging, _ in batch.staging:
                self._unregister_staging(staging)
            if rows:
                self._headers.give(rows)

    def _add_put(self, batch: _Batch, i: int, key: Any, h: bytes, obj: MemoryObj, row: torch.Tensor) -> bool:
        n = obj.get_size()
        if obj.get_memory_format() != self.fmt or n > self.layout.data_bytes or n <= 0:
            self._warn_once(f"shape-{obj.get_memory_format().name}-{n}",
                            "tutti.lmcache: a %s chunk of %d bytes does not fit this store (%s, at most %d bytes); "
                            "not stored", obj.get_memory_format().name, n, self.fmt.name, self.layout.data_bytes)
            return False
        if not self._header(row, key, obj, n):
            self._warn_once("header", "tutti.lmcache: the key %s is too long for a chunk header; not stored",
                            key.to_string())
            return False
        raw = self._raw(obj)
        pieces = self.layout.data_pieces(n)
        source = self._direct(raw, n) if round_up(n) <= obj.get_physical_size() else None
        if source is None:
            source = self._staging(round_up(n), raw.device)
            if source is None:
                return False
            source[:n].copy_(raw[:n])
            batch.staging.append((i, source, n))
            self._count("staged_chunks")
            self._warn_once("staged-put", "tutti.lmcache: chunks on %s at %#x are not 4096-byte aligned or not "
                            "registrable; they are copied through a staging buffer", raw.device, raw.data_ptr())
        batch.keys.append(h)
        batch.index.append(i)
        batch.pieces.append(row)
        for offset, length in pieces:
            batch.pieces.append(source[offset : offset + length] if length else self._zero[:1])
        return True

    def _staging(self, nbytes: int, device: torch.device) -> Optional[torch.Tensor]:
        """A registered host buffer of nbytes (4096-aligned) for chunks the store cannot move directly."""
        try:
            t = tutti.empty(nbytes, torch.uint8)
            return self._store.register(t)
        except tutti.Error as e:
            logger.error("tutti.lmcache: no staging buffer of %d bytes: %s", nbytes, e)
            return None

    def _unregister_staging(self, staging: torch.Tensor) -> None:
        try:
            self._store.unregister(staging)
        except tutti.Error as e:  # in flight (a timed-out IO): the store keeps it alive
            logger.warning("tutti.lmcache: staging buffer stays registered: %s", e)

    # ------------------------------------------------------------------------------------------- gets

    def contains(self, key: Any, pin: bool = False) -> bool:
        """True when the chunk is durable in the store (puts in flight are not). pin=True also pins
        it against eviction (a counted pin; unpin() releases one)."""
        if self._closed or not self._try_open_reader():
            return False
        h = self.store_key(key)
        if pin and not self.settings.read_only:
            try:
                self._store.pin([h])
                return True
            except tutti.Error:
                return False
        return self._store.lookup([h]) == 1

    def batched_contains(self, keys: List[Any], pin: bool = False) -> int:
        """The number of leading keys the store holds (one index lookup); pins them when asked."""
        if self._closed or not keys or not self._try_open_reader():
            return 0
        hkeys = [self.store_key(k) for k in keys]
        n = self._store.lookup(hkeys)
        if pin and n and not self.settings.read_only:
            try:
                self._store.pin(hkeys[:n])
            except tutti.Error:  # one was evicted meanwhile: pin one by one up to it
                pinned = 0
                for h in hkeys[:n]:
                    try:
                        self._store.pin([h])
                    except tutti.Error:
                        break
                    pinned += 1
                n = pinned
        return n

    def get_blocking(self, key: Any) -> Optional[MemoryObj]:
        return self.batched_get_blocking([key])[0]

    def get_non_blocking(self, key: Any, location: Optional[str] = None) -> Optional[concurrent.futures.Future]:
        if self._closed or not self.contains(key):
            return None
        future = self._get_executor.submit(self.get_blocking, key)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget_future)
        return future

    async def batched_async_contains(self, lookup_id: str, keys: List[Any], pin: bool = False) -> int:
        return self.batched_contains(keys, pin)

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any], transfer_spec: Any = None) -> list:
        """The leading chunks that load and verify (LMCache's async loading expects a prefix)."""
        import asyncio

        objs = await asyncio.to_thread(self.batched_get_blocking, list(keys))
        out = []
        for i, obj in enumerate(objs):
            if obj is None:
                for rest in objs[i + 1 :]:
                    if rest is not None:
                        rest.ref_count_down()
                break
            out.append(obj)
        return out

    def batched_get_blocking(self, keys: List[Any]) -> List[Optional[MemoryObj]]:
        """Reads the chunks with ONE runtime submit (per 8192 requests) into objects of LMCache's
        allocator. A chunk that is not stored, fails its checksum or does not match its key is
        None: a miss, never wrong bytes. Objects returned carry one reference, LMCache's."""
        out: List[Optional[MemoryObj]] = [None] * len(keys)
        if self._closed or not keys or self.local_cpu_backend is None or not self._try_open_reader():
            return out
        if self.settings.read_only:
            return out
        for start in range(0, len(keys), self._max_keys_per_submit):
            part = list(keys[start : start + self._max_keys_per_submit])
            out[start : start + len(part)] = self._get_part(part)
        self._count("get_chunks", len(keys))
        hits = sum(o is not None for o in out)
        self._count("get_hits", hits)
        self._count("get_misses", len(keys) - hits)
        return out

    def _allocate(self, n: int) -> list[MemoryObj]:
        backend = self.local_cpu_backend
        objs = None
        if n > 1 and hasattr(backend, "batched_allocate"):
            objs = backend.batched_allocate(self.full_shapes, self.full_dtypes, n, self.fmt, busy_loop=False)
        if objs is None:
            objs = []
            for _ in range(n):
                obj = backend.allocate(self.full_shapes, self.full_dtypes, self.fmt, busy_loop=False)
                if obj is None:
                    break
                objs.append(obj)
        return list(objs)

    def _get_part(self, keys: list) -> list:
        out: list = [None] * len(keys)
        objs = self._allocate(len(keys))
        if len(objs) < len(keys):
            self._warn_once("allocate", "tutti.lmcache: LMCache's CPU buffer is full (%d of %d chunks allocated); "
                            "the rest are misses", len(objs), len(keys))
        if not objs:
            return out
        batch = _Batch()
        rows = self._headers.take(len(objs))
        batch.headers = rows
        keep = False
        accepted: set[int] = set()
        try:
            for i, obj in enumerate(objs):
                raw = self._raw(obj)
                full = self.layout.data_bytes
                dest = self._direct(raw, full) if round_up(full) <= obj.get_physical_size() else None
                if dest is None:
                    dest = self._staging(round_up(full), raw.device)
                    if dest is None:
                        continue
                    batch.staging.append((i, dest, full))
                    self._count("staged_chunks")
                batch.keys.append(self.store_key(keys[i]))
                batch.index.append(i)
                batch.pieces.append(rows[i])
                for offset, length in self.layout.full_pieces():
                    batch.pieces.append(dest[offset : offset + length])
            if not batch.keys:
                return out
            try:
                io = self._store.load(batch.keys, 0, batch.pieces)
            except tutti.Error as e:
                logger.error("tutti.lmcache: load of %d chunks refused: %s", len(batch.keys), e)
                return out
            try:
                result = self._store.wait(io, timeout_s=self.settings.io_timeout_s, check=False)
            except tutti.TimeoutError:
                logger.error("tutti.lmcache: %d gets did not complete in %.0f s; misses (their buffers stay "
                             "allocated)", len(batch.keys), self.settings.io_timeout_s)
                keep = True
                return out
            staged = {i: (t, nbytes) for i, t, nbytes in batch.staging}
            damaged = []
            for k, block in enumerate(result.blocks):
                i = batch.index[k]
                if not block.ok:
                    if block.status == tutti.StatusCode.DATA_LOSS:
                        damaged.append(batch.keys[k])
                        logger.warning("tutti.lmcache: chunk %s refused: %s", keys[i].to_string(), block.message)
                    continue
                header = self._read_header(rows[i])
                if i in staged:
                    n = header.get("bytes", 0) if isinstance(header, dict) else 0
                    if isinstance(n, int) and 0 < n <= self.layout.data_bytes:
                        self._raw(objs[i])[:n].copy_(staged[i][0][:n])
                if self._accept(objs[i], keys[i], header):
                    accepted.add(i)
                    out[i] = objs[i]
                    self._count("get_bytes", objs[i].get_size())
                else:
                    self._count("rejected_chunks")
            if damaged:
                self._evict_damaged(damaged)
            return out
        finally:
            if not keep:
                for i, obj in enumerate(objs):
                    if i not in accepted:
                        obj.ref_count_down()
                for _, staging, _ in batch.staging:
                    self._unregister_staging(staging)
                self._headers.give(rows)

    def _accept(self, obj: MemoryObj, key: Any, header: Optional[dict]) -> bool:
        """Checks the header read with a chunk against the key asked for and the object it was read
        into; shortens the object to an unfull chunk's tokens (as LMCache's remote connectors do,
        lmcache/v1/storage_backend/connector/base_connector.py). False = a miss."""
        try:
            if header is None:
                raise ValueError("no chunk header")
            if header["key"] != key.to_string():
                raise ValueError(f"the header names {header['key']!r}")
            if header["fmt"] != obj.get_memory_format().name:
                raise ValueError(f"format {header['fmt']}")
            dtypes = [dtype_of(d) for d in header["dtypes"]]
            shapes = [torch.Size(s) for s in header["shapes"]]
            n = header["bytes"]
            if dtypes != list(obj.get_dtypes()) or len(shapes) != len(obj.get_shapes()):
                raise ValueError(f"dtypes {header['dtypes']}, {len(shapes)} groups")
            if not isinstance(n, int) or n != size_of(shapes, dtypes) or not 0 < n <= obj.get_size():
                raise ValueError(f"{n} bytes for shapes {header['shapes']}")
            token_dim = self.fmt.token_dim()
            tokens = {s[token_dim] for s in shapes}
            for s, full in zip(shapes, obj.get_shapes()):
                if len(s) != len(full) or any(a != b for d, (a, b) in enumerate(zip(s, full)) if d != token_dim):
                    raise ValueError(f"shape {list(s)} against {list(full)}")
            if len(tokens) != 1 or not 0 < next(iter(tokens)) <= self.chunk_tokens:
                raise ValueError(f"token counts {sorted(tokens)}")
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("tutti.lmcache: chunk %s refused: its header does not match (%s)", key.to_string(), e)
            return False
        if n != obj.get_size():
            obj.raw_data = obj.raw_data[:n]
            obj.meta.shape = shapes[0]
            obj.meta.shapes = shapes
            prefix = [0]
            for s, d in zip(shapes, dtypes):
                prefix.append(prefix[-1] + math.prod(s) * d.itemsize)
            obj.group_prefix_sum = prefix
        return True

    def _evict_damaged(self, hkeys: list[bytes]) -> None:
        try:
            self._count("evicted_damaged", self._store.evict(hkeys))
        except tutti.Error as e:
            logger.warning("tutti.lmcache: damaged chunks not evicted: %s", e)

    # ------------------------------------------------------------------------- pins, removal, closing

    def pin(self, key: Any) -> bool:
        if self._store is None or self.settings.read_only:
            return False
        try:
            self._store.pin([self.store_key(key)])
            return True
        except tutti.Error:
            return False

    def unpin(self, key: Any) -> bool:
        if self._store is None or self.settings.read_only:
            return False
        try:
            self._store.unpin([self.store_key(key)])
            return True
        except tutti.Error:
            return False

    def remove(self, key: Any, force: bool = True) -> bool:
        """Evicts the chunk (its index record first). A pinned chunk stays, whatever `force` says:
        the store never evicts a pinned block."""
        return self.batched_remove([key], force) == 1

    def batched_remove(self, keys: list[Any], force: bool = True) -> int:
        if self._store is None or self.settings.read_only or not keys:
            return 0
        try:
            return self._store.evict([self.store_key(k) for k in keys])
        except tutti.Error as e:
            logger.warning("tutti.lmcache: remove failed: %s", e)
            return 0

    def touch_cache(self) -> None:
        """The store's CLOCK eviction sees every load; nothing to do."""

    def get_allocator_backend(self) -> Any:
        """LMCache's LocalCPUBackend: puts and gets use its MemoryObjs, so StorageManager.batched_put
        hands them over without a copy."""
        return self.local_cpu_backend

    def _drain(self, timeout_s: float) -> bool:
        """Waits at most timeout_s for every put and non-blocking get; True when none is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                futures = list(self._futures)
            if not futures:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            concurrent.futures.wait(futures, timeout=remaining)

    def flush(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until every put submitted so far is durable or failed (at most timeout_s,
        io_timeout_s by default); True when none is left."""
        return self._drain(self.settings.io_timeout_s if timeout_s is None else timeout_s)

    def close(self) -> None:
        """Waits for the puts in flight (at most io_timeout_s), then closes the store and the runtime."""
        if self._closed:
            return
        self._closed = True
        drained = self._drain(self.settings.io_timeout_s)
        self._put_executor.shutdown(wait=drained)
        self._get_executor.shutdown(wait=drained)
        if not drained:
            logger.error("tutti.lmcache: closing with puts in flight; the store keeps their memory alive")
        self._release()

    def _release(self) -> None:
        store, runtime = self._store, self._runtime
        self._store = self._runtime = None
        if store is not None:
            store.close()
        if runtime is not None:
            try:
                runtime.shutdown(drain_timeout_s=self.settings.io_timeout_s if hasattr(self, "settings") else 5.0)
            except tutti.Error as e:
                logger.error("tutti.lmcache: runtime shutdown: %s", e)

    def __str__(self) -> str:
        return "TuttiStorageBackend"
