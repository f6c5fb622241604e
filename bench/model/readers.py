"""The restore paths that bench/model/ttft.py times against each other, all reading the same bytes.

Every reader restores the first `blocks` blocks of every layer of a prefix from the KV store's own
layer files into the same destination tensors, one per layer, shaped (blocks, 2, kv_heads,
block_tokens, head_dim): K then V of block b are `dest[l][b]`, which is also slot b of
`<store>/layer-<l>.kv` (a fresh store hands out slots 0, 1, 2, ... in the order keys are first
stored, docs/kv-store.md "Layout"; ttft.py checks that before timing anything). A reader:

    reader.prepare(destinations)   # once per model: drivers, file handles, buffers (untimed)
    reader.start(blocks)           # the request arrives: submit or start every layer's reads
    reader.wait_layer(l)           # blocks until layer l is in its destination (and verified)
    stats = reader.finish()        # after the forward pass: bytes, verification, queue depths
    reader.close()

- TuttiReader: KvStore.lookup + load_layers (one runtime submit per layer, all layers at once) and
  KvStore.wait_layer, which verifies each block's XXH3-64 before returning.
- CuFileReader: cuFileRead (cuda.bindings.cufile when it imports, else a ctypes wrapper of
  libcufile) from `queue_depth` threads, one `io_bytes` read at a time each.
- KvikioReader: one kvikio.CuFile.pread per layer (all layers at once) on KvikIO's thread pool of
  `queue_depth` threads, tasks of `io_bytes`, O_DIRECT reads allowed.
- PreadReader: os.preadv with O_DIRECT into a pinned buffer, then a copy into the destination
  (cudaMemcpyAsync + synchronize; on the CPU the read goes straight into the destination), from
  `threads` threads (default 1: the simple loop a user writes first).
- disk_limit(): the disk's own limit, os.preadv with O_DIRECT of the same byte ranges from 32
  threads into host memory (queue depth 32, no GPU, no copies).

Errors: prepare raises Unavailable (a library or driver that is not there: the method is reported
"not measured" with the reason); start/wait_layer raise ReaderError naming the layer, the file, the
offset and the call that failed, or TimeoutError after `timeout_s`. Nothing is served unverified by
the store; the other readers do not verify (their users have no checksums), so ttft.py compares
every restored byte with the prefill's KV after each run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import threading
import time


class Unavailable(Exception):
    """The reader's library, driver or device is not there; the method is skipped with this reason."""


class ReaderError(Exception):
    """A read failed or returned fewer bytes than asked."""


def layer_path(directory: str, layer: int) -> str:
    return os.path.join(directory, f"layer-{layer:05d}.kv")


def _byte_view(tensor):
    """The tensor's bytes as a flat uint8 tensor (a view, no copy)."""
    import torch

    return tensor.view(torch.uint8).reshape(-1)


class _LayerGates:
    """One event per layer, set when that layer is complete; an error wakes every waiter."""

    def __init__(self, layers: int):
        self.events = [threading.Event() for _ in range(layers)]
        self.ready_at = [0.0] * layers
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def done(self, layer: int) -> None:
        self.ready_at[layer] = time.perf_counter()
        self.events[layer].set()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        for e in self.events:
            e.set()

    def wait(self, layer: int, timeout_s: float, name: str) -> None:
        if not self.events[layer].wait(timeout_s):
            raise TimeoutError(f"{name}: layer {layer} not restored within {timeout_s} s")
        if self.error is not None:
            raise ReaderError(f"{name}: {self.error}") from self.error


class _GatedReader:
    """wait_layer / drain over the gates of the current run."""

    gates: _LayerGates | None = None
    label = ""  # the reader's name in a timeout's message

    def wait_layer(self, layer: int) -> None:
        self.gates.wait(layer, self.timeout_s, self.label)

    def drain(self) -> None:
        """After a failed run: waits until every layer is done or the run failed (bounded)."""
        if self.gates is not None:
            for layer in range(len(self.gates.events)):
                self.gates.events[layer].wait(self.timeout_s)
            if getattr(self, "pool", None) is not None:
                self.pool.idle(self.timeout_s)


class _PooledReader(_GatedReader):
    """A reader whose layers are chunks read by a _ChunkPool (self.pool): one task per chunk of io_bytes."""

    def start(self, blocks: int) -> None:
        per_layer = [_chunks(blocks, self.slot_bytes, self.io_bytes)] * self.layers
        self.gates = self.pool.start(self.layers, per_layer)

    def finish(self) -> dict:
        return {}


class _ChunkPool:
    """Persistent worker threads that read chunks (layer, offset, length) in submission order and
    open a layer's gate when its last chunk is done. `work(worker, layer, offset, length)` does one
    chunk; each worker owns its index for per-thread buffers."""

    def __init__(self, name: str, threads: int, work, thread_init=None):
        self.name, self.work, self.thread_init = name, work, thread_init
        self.tasks: queue.Queue = queue.Queue()
        self.gates: _LayerGates | None = None
        self.remaining: list[int] = []
        self.lock = threading.Lock()
        self.workers = [threading.Thread(target=self._run, args=(i,), name=f"{name}-{i}", daemon=True)
                        for i in range(threads)]
        for w in self.workers:
            w.start()

    def start(self, layers: int, chunks_per_layer: list[list[tuple[int, int]]]) -> _LayerGates:
        self.gates = _LayerGates(layers)
        self.remaining = [len(c) for c in chunks_per_layer]
        for layer, chunks in enumerate(chunks_per_layer):
            if not chunks:
                self.gates.done(layer)
            for offset, length in chunks:
                self.tasks.put((self.gates, layer, offset, length))
        return self.gates

    def _run(self, worker: int) -> None:
        init_error = None
        if self.thread_init is not None:
            try:
                self.thread_init()
            except BaseException as e:  # noqa: BLE001  (reported to every run through the gates)
                init_error = e
        while True:
            task = self.tasks.get()
            if task is None:
                self.tasks.task_done()
                return
            try:
                self._one(worker, init_error, *task)
            finally:
                self.tasks.task_done()

    def _one(self, worker: int, init_error, gates: _LayerGates, layer: int, offset: int, length: int) -> None:
        if gates.error is not None:
            return  # a chunk of this run failed: drop the rest
        if init_error is not None:
            gates.fail(ReaderError(f"{self.name} thread {worker}: {init_error}"))
            return
        try:
            self.work(worker, layer, offset, length)
        except BaseException as e:  # noqa: BLE001  (reported through the gates)
            gates.fail(ReaderError(f"layer {layer}, offset {offset}, {length} bytes: {e}"))
            return
        with self.lock:
            self.remaining[layer] -= 1
            last = self.remaining[layer] == 0
        if last:
            gates.done(layer)

    def idle(self, timeout_s: float) -> None:
        """Waits (bounded) until every queued chunk was taken and finished or dropped."""
        deadline = time.monotonic() + timeout_s
        while self.tasks.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)

    def close(self) -> None:
        for _ in self.workers:
            self.tasks.put(None)
        for w in self.workers:
            w.join(timeout=30)


def _chunks(blocks: int, slot_bytes: int, io_bytes: int) -> list[tuple[int, int]]:
    total = blocks * slot_bytes
    return [(off, min(io_bytes, total - off)) for off in range(0, total, io_bytes)]


class TuttiReader:
    """KvStore.load_layers at start, KvStore.wait_layer(l) per layer (verifies every block)."""

    name = "tutti"

    def __init__(self, store, keys: list[bytes], timeout_s: float):
        self.store, self.keys, self.timeout_s = store, keys, timeout_s
        self.detail = ""

    def prepare(self, destinations) -> None:
        self.destinations = destinations  # registered with the store by ttft.py

    def start(self, blocks: int) -> None:
        keys = self.keys[:blocks]
        hits = self.store.lookup(keys)
        if hits != blocks:
            raise ReaderError(f"tutti: lookup found {hits} of {blocks} blocks of the prefix")
        self.blocks, self.bytes, self.verified, self.results = blocks, 0, 0, 0
        self.store.load_layers(keys, self.destinations, blocks=list(range(blocks)))

    def wait_layer(self, layer: int) -> None:
        # check=True raises the first failed block's error (DATA_LOSS for a checksum mismatch).
        for r in self.store.wait_layer(layer, timeout_s=self.timeout_s):
            self.bytes += r.bytes
            self.verified += r.verified_bytes
            self.results += 1

    def finish(self) -> dict:
        return {"bytes": self.bytes, "verified_bytes": self.verified, "layer_results": self.results}

    def drain(self) -> None:
        """After a failed run: waits for every layer's loads still in flight (errors ignored)."""
        for layer in range(len(self.destinations)):
            try:
                self.store.wait_layer(layer, timeout_s=self.timeout_s, check=False)
            except Exception:  # noqa: BLE001  (best effort: the run already failed)
                pass

    def close(self) -> None:
        pass


class _CuFileBindings:
    """cuFile through cuda.bindings.cufile (cuda-python)."""

    def __init__(self):
        from cuda.bindings import cufile  # noqa: F401  (ImportError: use ctypes)

        self.cf = cufile
        self.api = "cuda.bindings.cufile"
        self._descriptors = []

    def driver_open(self) -> None:
        self.cf.driver_open()

    def driver_close(self) -> None:
        self.cf.driver_close()

    def handle_register(self, fd: int) -> int:
        descr = self.cf.Descr()
        descr.type = self.cf.FileHandleType.OPAQUE_FD
        descr.handle.fd = fd
        descr.fs_ops = 0
        self._descriptors.append(descr)  # kept alive while registered
        return self.cf.handle_register(descr.ptr)

    def handle_deregister(self, handle: int) -> None:
        self.cf.handle_deregister(handle)

    def buf_register(self, address: int, length: int) -> None:
        self.cf.buf_register(address, length, 0)

    def buf_deregister(self, address: int) -> None:
        self.cf.buf_deregister(address)

    def read(self, handle: int, base: int, length: int, file_offset: int, base_offset: int) -> int | None:
        n = self.cf.read(handle, base, length, file_offset, base_offset)  # raises cuFileError on failure
        return None if n is None else int(n)

    def version(self) -> str:
        try:
            return str(self.cf.get_version())
        except Exception:  # noqa: BLE001  (older bindings)
            return "?"


class _CuFileError(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]  # CUfileError_t


class _CuFileHandleUnion(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class _CuFileDescr(ctypes.Structure):  # CUfileDescr_t (cufile.h)
    _fields_ = [("type", ctypes.c_int), ("handle", _CuFileHandleUnion), ("fs_ops", ctypes.c_void_p)]


_CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1


class _CuFileCtypes:
    """cuFile through ctypes over libcufile.so.0 (cufile.h's C API)."""

    def __init__(self):
        self.lib = None
        errors = []
        for name in self._candidates():
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError as e:
                errors.append(f"{name}: {e}")
        if self.lib is None:
            raise Unavailable("libcufile not found (" + "; ".join(errors) + ")")
        lib = self.lib
        for fn in ("cuFileDriverOpen", "cuFileBufRegister", "cuFileBufDeregister", "cuFileHandleRegister"):
            getattr(lib, fn).restype = _CuFileError
        lib.cuFileHandleRegister.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_CuFileDescr)]
        lib.cuFileHandleDeregister.argtypes = [ctypes.c_void_p]
        lib.cuFileHandleDeregister.restype = None
        lib.cuFileBufRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cuFileBufDeregister.argtypes = [ctypes.c_void_p]
        lib.cuFileRead.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64,
                                   ctypes.c_int64]
        lib.cuFileRead.restype = ctypes.c_ssize_t
        self.close_fn = getattr(lib, "cuFileDriverClose_v2", None) or lib.cuFileDriverClose
        self.close_fn.restype = _CuFileError
        self.api = "ctypes over libcufile"

    @staticmethod
    def _candidates() -> list[str]:
        names = ["libcufile.so.0", "libcufile.so"]
        try:  # the nvidia-cufile wheel
            import nvidia.cufile as pkg

            for root in list(getattr(pkg, "__path__", [])):
                names.insert(0, os.path.join(root, "lib", "libcufile.so.0"))
        except ImportError:
            pass
        found = ctypes.util.find_library("cufile")
        if found:
            names.append(found)
        names.append("/usr/local/cuda/lib64/libcufile.so.0")
        return names

    @staticmethod
    def _check(result: _CuFileError, call: str) -> None:
        if result.err != 0:
            raise ReaderError(f"{call} failed: cuFile error {result.err}, CUDA driver error {result.cu_err}")

    def driver_open(self) -> None:
        self._check(self.lib.cuFileDriverOpen(), "cuFileDriverOpen")

    def driver_close(self) -> None:
        self._check(self.close_fn(), "cuFileDriverClose")

    def handle_register(self, fd: int) -> int:
        descr = _CuFileDescr()
        descr.type = _CU_FILE_HANDLE_TYPE_OPAQUE_FD
        descr.handle.fd = fd
        handle = ctypes.c_void_p()
        self._check(self.lib.cuFileHandleRegister(ctypes.byref(handle), ctypes.byref(descr)), "cuFileHandleRegister")
        return handle.value

    def handle_deregister(self, handle: int) -> None:
        self.lib.cuFileHandleDeregister(ctypes.c_void_p(handle))

    def buf_register(self, address: int, length: int) -> None:
        self._check(self.lib.cuFileBufRegister(ctypes.c_void_p(address), length, 0), "cuFileBufRegister")

    def buf_deregister(self, address: int) -> None:
        self._check(self.lib.cuFileBufDeregister(ctypes.c_void_p(address)), "cuFileBufDeregister")

    def read(self, handle: int, base: int, length: int, file_offset: int, base_offset: int) -> int:
        return int(self.lib.cuFileRead(ctypes.c_void_p(handle), ctypes.c_void_p(base), length, file_offset,
                                       base_offset))

    def version(self) -> str:
        return "?"


class CuFileReader(_PooledReader):
    """cuFileRead from `queue_depth` threads into the registered destination tensors."""

    name = "cufile"
    label = "cuFile"

    def __init__(self, directory: str, layers: int, slot_bytes: int, io_bytes: int, queue_depth: int,
                 timeout_s: float, config_dir: str):
        self.directory, self.layers, self.slot_bytes = directory, layers, slot_bytes
        self.io_bytes, self.queue_depth, self.timeout_s = io_bytes, queue_depth, timeout_s
        self.config_dir = config_dir
        self.api = None
        self.fds, self.handles, self.registered, self.pool, self.notes = [], [], [], None, []
        self.detail = ""

    def _setup(self, api, destinations) -> None:
        """cuFileDriverOpen, an O_DIRECT descriptor and cuFileHandleRegister per layer file, and
        cuFileBufRegister of each destination (compat mode reads without it, so a refusal is noted)."""
        api.driver_open()
        self.api = api
        try:
            for layer in range(self.layers):
                fd = os.open(layer_path(self.directory, layer), os.O_RDONLY | os.O_DIRECT)
                self.fds.append(fd)
                self.handles.append(api.handle_register(fd))
        except Exception as e:
            raise ReaderError(f"cuFileHandleRegister of {layer_path(self.directory, len(self.handles))}: {e}") from e
        self.bases, self.notes = [], []
        for t in destinations:
            base, length = t.data_ptr(), t.numel() * t.element_size()
            try:
                api.buf_register(base, length)
                self.registered.append(base)
            except Exception as e:  # noqa: BLE001  (compat mode works without registration)
                self.notes = [f"cuFileBufRegister refused ({e}): reads into unregistered memory"]
            self.bases.append(base)

    def prepare(self, destinations) -> None:
        import torch

        if not torch.cuda.is_available() or destinations[0].device.type != "cuda":
            raise Unavailable("needs a CUDA device (cuFile reads into GPU memory)")
        errors = []
        for attempt in range(2):
            for make in (_CuFileBindings, _CuFileCtypes):
                try:
                    api = make()
                except (ImportError, Unavailable) as e:
                    errors.append(f"{make.__name__}: {e}")
                    continue
                try:
                    self._setup(api, destinations)
                    break
                except Exception as e:  # noqa: BLE001  (a refusal or another bindings version: try the next)
                    errors.append(f"{api.api}: {e}")
                    self.close()
            if self.api is not None or attempt == 1 or "CUFILE_ENV_PATH_JSON" in os.environ:
                break
            # The machine's cufile.json may refuse compat mode: allow it and try once more, as
            # bench/support/cufile_reader.hpp does.
            path = os.path.join(self.config_dir, "cufile.json")
            with open(path, "w") as f:
                f.write('{\n  "properties": { "allow_compat_mode": true }\n}\n')
            os.environ["CUFILE_ENV_PATH_JSON"] = path
        if self.api is None:
            raise Unavailable(" | ".join(errors) + " (on a VM without udev, cuFile needs the record that "
                              "scripts/gpu-machine-env.sh's tutti_provide_udev_record writes)")
        nvidia_fs = os.path.exists("/proc/driver/nvidia-fs/version")
        mode = "GPUDirect possible (nvidia-fs loaded)" if nvidia_fs else "compat mode (no nvidia-fs)"
        self.detail = "; ".join([f"{self.api.api}, cuFile {self.api.version()}, {mode}, {self.queue_depth} threads x "
                                 f"{self.io_bytes} B reads"] + self.notes)
        device = destinations[0].device
        self.pool = _ChunkPool("cufile", self.queue_depth, self._read, lambda: torch.cuda.set_device(device))

    def _read(self, worker: int, layer: int, offset: int, length: int) -> None:
        done = 0
        while done < length:
            n = self.api.read(self.handles[layer], self.bases[layer], length - done, offset + done, offset + done)
            if n is None:  # bindings versions whose read() raises on failure and returns nothing
                n = length - done
            if n <= 0:
                raise ReaderError(f"cuFileRead returned {n} at {layer_path(self.directory, layer)} offset "
                                  f"{offset + done}")
            done += n

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.api is not None:
            for base in self.registered:
                try:
                    self.api.buf_deregister(base)
                except Exception:  # noqa: BLE001  (best effort at teardown)
                    pass
            for h in self.handles:
                try:
                    self.api.handle_deregister(h)
                except Exception:  # noqa: BLE001
                    pass
        for fd in self.fds:
            os.close(fd)
        self.fds, self.handles, self.registered, self.api = [], [], [], None


class KvikioReader(_GatedReader):
    """kvikio.CuFile(path).pread per layer, all layers submitted at start; a waiter thread opens each
    layer's gate when its future completes."""

    name = "kvikio"
    label = "KvikIO"

    def __init__(self, directory: str, layers: int, slot_bytes: int, io_bytes: int, queue_depth: int,
                 timeout_s: float):
        self.directory, self.layers, self.slot_bytes = directory, layers, slot_bytes
        self.io_bytes, self.queue_depth, self.timeout_s = io_bytes, queue_depth, timeout_s
        self.files = []
        self.detail = ""

    def prepare(self, destinations) -> None:
        import torch

        if not torch.cuda.is_available() or destinations[0].device.type != "cuda":
            raise Unavailable("needs a CUDA device (KvikIO reads into GPU memory here)")
        try:
            import kvikio
            import kvikio.defaults
        except Exception as e:  # noqa: BLE001  (ImportError, or a library that does not load)
            raise Unavailable(f"import kvikio: {e} (bring the kvikio-cu13, libkvikio-cu13 and rapids-logger "
                              "wheels: docs/kv-cache.md)") from e
        self.kvikio = kvikio
        kvikio.defaults.set({"num_threads": self.queue_depth, "task_size": self.io_bytes,
                             "auto_direct_io_read": True})
        self.files = [kvikio.CuFile(layer_path(self.directory, layer), "r") for layer in range(self.layers)]
        self.destinations = [_byte_view(t) for t in destinations]
        mode = kvikio.defaults.get("compat_mode")
        self.detail = (f"KvikIO {kvikio.__version__}, compat_mode {mode}, {self.queue_depth} threads, "
                       f"tasks of {self.io_bytes} B, auto_direct_io_read on")

    def start(self, blocks: int) -> None:
        size = blocks * self.slot_bytes
        self.gates = _LayerGates(self.layers)
        futures = [f.pread(self.destinations[layer][:size], size, 0) for layer, f in enumerate(self.files)]
        self.waiter = threading.Thread(target=self._wait_all, args=(futures, size), daemon=True)
        self.waiter.start()

    def _wait_all(self, futures, size) -> None:
        for layer, future in enumerate(futures):
            try:
                n = future.get()
            except Exception as e:  # noqa: BLE001
                self.gates.fail(ReaderError(f"layer {layer}: {e}"))
                return
            if n != size:
                self.gates.fail(ReaderError(f"layer {layer}: pread returned {n} of {size} bytes"))
                return
            self.gates.done(layer)

    def finish(self) -> dict:
        self.waiter.join(timeout=self.timeout_s)
        return {}

    def drain(self) -> None:
        if getattr(self, "waiter", None) is not None:
            self.waiter.join(timeout=self.timeout_s)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []


class PreadReader(_PooledReader):
    """os.preadv (O_DIRECT) into a pinned buffer per thread, then a copy into the destination on a
    CUDA stream of that thread, synchronized before the buffer is reused. On the CPU the read goes
    straight into the destination (no copy)."""

    name = "pread"
    label = "pread"

    def __init__(self, directory: str, layers: int, slot_bytes: int, io_bytes: int, threads: int, timeout_s: float):
        self.directory, self.layers, self.slot_bytes = directory, layers, slot_bytes
        self.io_bytes, self.threads, self.timeout_s = io_bytes, threads, timeout_s
        self.fds, self.pool = [], None
        self.detail = ""

    def prepare(self, destinations) -> None:
        import torch

        import tutti

        self.cuda = destinations[0].device.type == "cuda"
        self.fds = [os.open(layer_path(self.directory, layer), os.O_RDONLY | os.O_DIRECT)
                    for layer in range(self.layers)]
        self.destinations = [_byte_view(t) for t in destinations]
        if self.cuda:
            self.pinned = [tutti.empty(self.io_bytes, torch.uint8, pin_memory=True) for _ in range(self.threads)]
            self.streams = [torch.cuda.Stream() for _ in range(self.threads)]
            self.detail = (f"pread O_DIRECT into pinned memory + cudaMemcpyAsync/synchronize, {self.threads} "
                           f"thread(s) x {self.io_bytes} B")
        else:
            self.detail = f"pread O_DIRECT into the destination, {self.threads} thread(s) x {self.io_bytes} B"
        device = destinations[0].device
        self.pool = _ChunkPool("pread", self.threads, self._read,
                               (lambda: torch.cuda.set_device(device)) if self.cuda else None)

    def _read(self, worker: int, layer: int, offset: int, length: int) -> None:
        import torch

        destination = self.destinations[layer][offset:offset + length]
        if self.cuda:
            buffer = self.pinned[worker][:length]
            _pread_full(self.fds[layer], buffer.numpy(), offset)
            with torch.cuda.stream(self.streams[worker]):
                destination.copy_(buffer, non_blocking=True)
            self.streams[worker].synchronize()
        else:
            _pread_full(self.fds[layer], destination.numpy(), offset)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _pread_full(fd: int, array, offset: int) -> None:
    """Reads len(array) bytes at `offset` into a writable uint8 numpy array (continues short reads)."""
    view = memoryview(array).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ReaderError(f"preadv returned {n} at offset {offset + done}")
        done += n


def disk_limit(directory: str, layers: int, blocks: int, slot_bytes: int, io_bytes: int, queue_depth: int) -> dict:
    """O_DIRECT reads of the prefix's byte ranges of every layer file from `queue_depth` threads into
    host memory: the disk's limit for these files, measured like fio's psync engine with numjobs =
    queue_depth. Returns seconds, bytes and GB/s (10^9 bytes/s)."""
    import numpy

    import tutti

    fds = [os.open(layer_path(directory, layer), os.O_RDONLY | os.O_DIRECT) for layer in range(layers)]
    tasks = [(layer, off, length) for layer in range(layers) for off, length in _chunks(blocks, slot_bytes, io_bytes)]
    buffers = [tutti.empty(io_bytes, numpy.uint8) for _ in range(queue_depth)]
    lock = threading.Lock()
    state = {"next": 0, "error": None}

    def work(i: int) -> None:
        while True:
            with lock:
                k = state["next"]
                state["next"] += 1
            if k >= len(tasks) or state["error"] is not None:
                return
            layer, off, length = tasks[k]
            try:
                _pread_full(fds[layer], buffers[i][:length], off)
            except Exception as e:  # noqa: BLE001
                state["error"] = f"{layer_path(directory, layer)} offset {off}: {e}"
                return

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(queue_depth)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    for fd in fds:
        os.close(fd)
    if state["error"] is not None:
        raise ReaderError(f"disk limit read: {state['error']}")
    total = sum(length for _, _, length in tasks)
    return {"seconds": seconds, "bytes": total, "gbps": total / seconds / 1e9, "queue_depth": queue_depth,
            "io_bytes": io_bytes}
