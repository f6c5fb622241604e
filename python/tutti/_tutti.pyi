"""
Tutti's C++ runtime (nanobind extension). Import the package `tutti`, not this module.
"""

import builtins
from collections.abc import Sequence
import enum


class StatusCode(enum.Enum):
    """
    The code of a Status (tutti::StatusCode); each non-OK one has an error class.
    """

    OK = 0

    INVALID_ARGUMENT = 1

    OUT_OF_RANGE = 2

    NOT_FOUND = 3

    UNSUPPORTED = 4

    NOT_READY = 5

    BUSY = 6

    RESOURCE_EXHAUSTED = 7

    TIMEOUT = 8

    DEVICE_ERROR = 9

    DATA_LOSS = 10

    INTERNAL = 11

class Direction(enum.Enum):
    """
    What a request does: READ (target -> memory), WRITE (memory -> target), FLUSH (make completed writes durable).
    """

    READ = 0

    WRITE = 1

    FLUSH = 2

class MemoryKind(enum.Enum):
    """Where a registered region lives."""

    HOST = 0

    PINNED_HOST = 1

    DEVICE = 2

class Error(Exception):
    """
    Base of every Tutti error. `code` is the tutti.StatusCode, `message` the C++ message (it names the field, the value and the limit).
    """

class InvalidArgument(Error, ValueError):
    """
    A field is malformed or violates a documented limit (INVALID_ARGUMENT); retrying cannot help.
    """

class OutOfRange(Error, ValueError):
    """
    An offset or length reaches past the end of a memory region or target (OUT_OF_RANGE).
    """

class NotFound(Error, LookupError):
    """
    A handle, file or block does not exist (NOT_FOUND), e.g. a closed target or an unregistered tensor.
    """

class Unsupported(Error, NotImplementedError):
    """
    A valid request this backend, build or file system cannot serve (UNSUPPORTED).
    """

class NotReady(Error):
    """The operation has not completed yet (NOT_READY)."""

class Busy(Error):
    """
    The object is in use (BUSY): unregister or close while IO on it is in flight; try again later.
    """

class ResourceExhausted(Error):
    """
    Backpressure or a full budget (RESOURCE_EXHAUSTED): queue, slots, memory or disk space; resubmit later.
    """

class TimeoutError(Error, builtins.TimeoutError):
    """
    A time budget ran out (TIMEOUT). For Io.wait the IO stays in flight: wait again.
    """

class DeviceError(Error, OSError):
    """
    The device or kernel reported an error (DEVICE_ERROR): an NVMe status or an errno.
    """

class DataLoss(Error):
    """
    Bytes would be wrong or lost (DATA_LOSS): a short transfer, a hole, a block that failed its checksum.
    """

class InternalError(Error):
    """A broken invariant inside Tutti (INTERNAL): a bug to report."""

def error_class(code: StatusCode) -> object:
    """
    The tutti.Error subclass raised for a StatusCode (e.g. StatusCode.TIMEOUT -> tutti.TimeoutError).

    Raises tutti.InvalidArgument for StatusCode.OK.
    """

def make_error(code: StatusCode, message: str) -> object:
    """
    The tutti.Error subclass instance for (code, message), not raised: what the C++ layer raises for that Status (str() is 'CODE: message'; `.code`, `.message`).
    """

def build_info() -> dict:
    """
    What was built: {'version', 'accelerator': 'host' | 'cuda', 'backends', 'kv_store', 'nanobind'}.
    """

ALIGNMENT: int = 4096

class Memory:
    """
    A registered region: the tensor or array given to Runtime.register, kept alive while registered.

    Thread-safety: any thread.
    """

    @property
    def address(self) -> int:
        """Address of the first byte (int)."""

    @property
    def size(self) -> int:
        """Size in bytes."""

    @property
    def kind(self) -> MemoryKind:
        """HOST, PINNED_HOST or DEVICE."""

    @property
    def device(self) -> int:
        """CUDA device ordinal of DEVICE memory; -1 for host memory."""

    @property
    def obj(self) -> object:
        """The registered object."""

    @property
    def registered(self) -> bool: ...

    def unregister(self) -> None:
        """
        Unregisters the region (one StorageRuntime.unregister_memory).

        Raises tutti.Busy while IO that uses it is in flight (it stays registered; wait for the IO and call again), tutti.NotFound when already unregistered.
        """

    def __repr__(self) -> str: ...

class Target:
    """An open target (a file, or a memfs file). Thread-safety: any thread."""

    @property
    def uri(self) -> str: ...

    @property
    def size(self) -> int:
        """Size in bytes at open."""

    @property
    def writable(self) -> bool: ...

    @property
    def is_open(self) -> bool: ...

    def close(self) -> None:
        """
        Closes the target (flushing first when opened with flush_on_close).

        Raises tutti.Busy while IO on it is in flight, tutti.TimeoutError when its flush did not finish in time (it stays open: call close again), tutti.NotFound when already closed.
        """

    def __repr__(self) -> str: ...

class Request:
    """
    One IO request: `length` bytes between memory[memory_offset:] and target[target_offset:].

    A tuple (direction, memory, memory_offset, target, target_offset, length) is accepted wherever a Request is. FLUSH takes memory=None and zero offsets and length.
    """

    def __init__(self, direction: Direction, memory: Memory | None, memory_offset: int, target: Target, target_offset: int, length: int) -> None: ...

    @property
    def direction(self) -> Direction: ...

    @direction.setter
    def direction(self, arg: Direction, /) -> None: ...

    @property
    def memory(self, /) -> Memory | None:
        """tutti.Memory, or None for FLUSH."""

    @memory.setter
    def memory(self, value: Memory | None, /) -> None: ...

    @property
    def memory_offset(self) -> int:
        """Bytes from the start of the registered region."""

    @memory_offset.setter
    def memory_offset(self, arg: int, /) -> None: ...

    @property
    def target(self, /) -> Target:
        """tutti.Target."""

    @target.setter
    def target(self, value: Target, /) -> None: ...

    @property
    def target_offset(self) -> int:
        """Bytes from the start of the target."""

    @target_offset.setter
    def target_offset(self, arg: int, /) -> None: ...

    @property
    def length(self) -> int:
        """Bytes to move (0 for FLUSH)."""

    @length.setter
    def length(self, arg: int, /) -> None: ...

    def __repr__(self) -> str: ...

class RequestResult:
    """The outcome of one request of an Io."""

    @property
    def index(self) -> int:
        """Index in the submitted list."""

    @property
    def accepted(self) -> bool:
        """False when submit rejected it (it never ran)."""

    @property
    def status(self) -> StatusCode:
        """StatusCode.OK, or why it was rejected or failed."""

    @property
    def message(self) -> str:
        """The C++ message ('' when OK)."""

    @property
    def bytes(self) -> int:
        """Bytes confirmed moved (never more than requested)."""

    @property
    def device_status(self) -> int:
        """Raw NVMe status (SCT << 8 | SC); 0 if none."""

    @property
    def commands(self) -> int:
        """Device commands it was split into."""

    @property
    def ok(self) -> bool: ...

    def __repr__(self) -> str: ...

class IoResult:
    """The result of a completed Io: one RequestResult per submitted request."""

    @property
    def requests(self) -> list[RequestResult]:
        """RequestResult per request, in submit order."""

    @property
    def requested_bytes(self) -> int:
        """Sum of the accepted requests' lengths."""

    @property
    def confirmed_bytes(self) -> int:
        """Sum of bytes confirmed moved."""

    @property
    def commands(self) -> int:
        """Device commands issued for the whole IO."""

    @property
    def failed(self) -> list[int]:
        """Indices of requests rejected at submit or failed, ascending."""

    @property
    def ok(self) -> bool:
        """True when every request was accepted and succeeded."""

    def __len__(self) -> int: ...

    def __getitem__(self, arg: int, /) -> RequestResult: ...

    def __repr__(self) -> str: ...

class Io:
    """
    A submitted batch. Requests rejected at submit never ran and are reported, never retried (partial commit).

    Thread-safety: one thread waits at a time.
    """

    @property
    def accepted(self) -> int:
        """Number of requests submit accepted."""

    @property
    def rejected(self) -> list[RequestResult]:
        """
        RequestResult of each request submit rejected (it never ran): validation errors, or RESOURCE_EXHAUSTED backpressure (resubmit it).
        """

    def __len__(self) -> int: ...

    def done(self) -> bool:
        """
        True once every accepted request completed (a non-blocking StorageRuntime.query).

        Raises the DataPath's progress error.
        """

    def wait(self, timeout_s: float, check: bool = True) -> IoResult:
        """
        Waits at most timeout_s seconds for the IO (GIL released; Ctrl-C interrupts within 50 ms and leaves the IO in flight, wait again) and returns its IoResult; later calls return the same result.

        Raises tutti.TimeoutError when not complete in time (the IO stays in flight: wait again), the DataPath's progress error, and with check=True (the default) the tutti.Error of the first rejected or failed request, whose `.result` is the IoResult (nothing is hidden: the other requests' bytes are there).
        """

    def __repr__(self) -> str: ...

class Runtime:
    """
    A Tutti StorageRuntime over one backend.

    Runtime(backend, **options): backend 'uring' (files on any file system, io_uring + O_DIRECT), 'nvme-soft' (files on an ext4 image, NVMe commands on the soft controller's queues; needs backing_path and block_device_path) or 'memfs' (host memory). Options per backend are listed in docs/python.md; an unknown option raises tutti.InvalidArgument.

    As a context manager it shuts down on exit with a bounded drain (destructor_drain_timeout_s, 5 s by default).

    Thread-safety: every method may be called from any thread.
    """

    def __init__(self, backend: str, **options) -> None: ...

    @property
    def backend(self) -> str: ...

    @property
    def alignment(self) -> int:
        """
        Bytes: address + memory_offset of every request must be a multiple (4096 for uring).
        """

    @property
    def offset_alignment(self) -> int:
        """
        Bytes: target_offset and length must be multiples (except a tail ending at the target's end).
        """

    @property
    def max_request_bytes(self) -> int: ...

    @property
    def max_batch_requests(self) -> int: ...

    def open(self, uri: str, writable: bool = False, flush_on_close: bool = False, allow_buffered: bool = False) -> Target:
        """
        Opens file:///path (uring, nvme-soft) or memfs://name?size=BYTES (memfs) and returns a Target.

        Raises tutti.InvalidArgument (malformed URI, unknown scheme), tutti.NotFound (no such file), tutti.Unsupported (no O_DIRECT, no FIEMAP), tutti.DataLoss (unwritten extents, nvme-soft), tutti.Busy after shutdown.
        """

    def open_batch(self, uris: Sequence[str], writable: bool = False, check: bool = True) -> list[Target | Error]:
        """
        Opens many URIs, resolving them on open_batch_threads threads; returns one Target per URI, in order.

        With check=True (default) raises the first failure's tutti.Error, whose `.results` lists a Target or an exception per URI (targets that opened stay open there); with check=False returns that list.
        """

    def register(self, obj: object, stream: object | None = None) -> Memory:
        """
        Registers a tensor or array without a copy (DLPack, or the buffer protocol) and returns a Memory.

        torch CPU tensors and numpy arrays are HOST memory, CUDA tensors DEVICE memory (CUDA build). The data must be dense (C-contiguous, or a permuted view of a contiguous buffer: one byte range), writable and start on a multiple of Runtime.alignment bytes (4096 for uring: allocate with tutti.empty). The object is kept alive until unregister succeeds. `stream` (CUDA build, uring, DEVICE memory): fence this region's staged copies on a CUDA stream (torch.cuda.Stream), see docs/python.md.

        Raises tutti.InvalidArgument (not an array, gaps between elements, misaligned, read-only), tutti.Unsupported (a memory kind no backend of this build takes), tutti.Busy after shutdown.
        """

    def unregister(self, memory: Memory) -> None:
        """Same as memory.unregister()."""

    def submit(self, requests: Sequence[Request | tuple[Direction, Memory | None, int, Target, int, int]]) -> Io:
        """
        Submits a list of requests (tutti.Request or 6-tuples) in one StorageRuntime.submit and returns an Io; never blocks.

        Each request is validated on its own: a rejected one (bad offset, misaligned, RESOURCE_EXHAUSTED backpressure ...) is in Io.rejected and in the IoResult, the others run. Raises tutti.InvalidArgument only for a malformed list (nothing submitted).
        """

    def shutdown(self, drain_timeout_s: float = 5.0) -> None:
        """
        Refuses new work, waits at most drain_timeout_s for in-flight IO, then closes every target and unregisters every region (their objects are released).

        Raises tutti.TimeoutError when IO did not drain (nothing is freed; call again), tutti.Busy when a device still holds memory.
        """

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: object | None, exc: object | None, traceback: object | None) -> bool: ...

    def inject_fault(self, action: str, delay_s: float = 0.0, nth_command: int = 0, max_fires: int = 1) -> int:
        """
        nvme-soft only, for tests: injects a fault into the soft controller's next I/O commands.

        action 'delay_completion' executes a command delay_s seconds late; 'complete_with_status' fails it with Unrecovered Read Error (the IO then fails tutti.DeviceError). nth_command: fire on the nth matching command (0: every one); max_fires: at most this many times (0: unlimited). Returns the rule id.

        Raises tutti.Unsupported on other backends.
        """

    def __repr__(self) -> str: ...

class BlockResult:
    """One block's outcome in a LayerResult or a commit."""

    @property
    def index(self) -> int:
        """Index of the key in the call."""

    @property
    def key(self) -> bytes:
        """The key (bytes; commit only, b'' in layer results)."""

    @property
    def status(self) -> StatusCode:
        """StatusCode.OK, NOT_FOUND (not stored), DATA_LOSS (checksum) ..."""

    @property
    def message(self) -> str: ...

    @property
    def ok(self) -> bool: ...

    def __repr__(self) -> str: ...

class LayerResult:
    """The outcome of one load or store of one layer."""

    @property
    def layer(self) -> int: ...

    @property
    def load(self) -> bool:
        """True for a load, False for a store."""

    @property
    def blocks(self) -> list[BlockResult]:
        """BlockResult per key, in call order."""

    @property
    def ok_blocks(self) -> int: ...

    @property
    def bytes(self) -> int:
        """Bytes moved for the OK blocks (piece lengths)."""

    @property
    def verified_bytes(self) -> int:
        """Bytes whose checksum matched (loads)."""

    @property
    def skipped_blocks(self) -> int:
        """Stores of keys already visible (nothing written)."""

    @property
    def ok(self) -> bool: ...

    def __repr__(self) -> str: ...

class KvIo:
    """
    One submitted load or store of one layer; wait for it with KvStore.wait.
    """

    @property
    def layer(self) -> int: ...

    @property
    def load(self) -> bool: ...

    @property
    def blocks(self) -> int:
        """Number of keys."""

    def __repr__(self) -> str: ...

class KvStore:
    """
    KV-cache blocks by the engine's block hash in preallocated files under one directory (docs/kv-store.md).

    KvStore(runtime, directory, namespace, capacity_bytes=0, read_only=False, create_if_missing=True, unsafe_skip_verification=False, io_timeout_s=60.0, host_checksum_threads=0): opens or creates the store; `namespace` is a dict of the kv::Namespace fields (model, dtype, block_tokens, layers, piece_bytes, hash_algorithm ...). Keys are bytes (1..64). A block is visible only after commit().

    Raises tutti.InvalidArgument (a namespace field, or a namespace differing from the stored one: every differing field named), tutti.Busy (another process is the writer: its pid is named), tutti.NotFound (no store and read_only or not create_if_missing), tutti.ResourceExhausted (not enough free space), tutti.DataLoss (a layer file of the wrong size).

    Thread-safety: any thread.
    """

    def __init__(self, runtime: object, directory: str, namespace: object, capacity_bytes: int = 0, read_only: bool = False, create_if_missing: bool = True, unsafe_skip_verification: bool = False, io_timeout_s: float = 60.0, host_checksum_threads: int = 0) -> None: ...

    @property
    def directory(self) -> str: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def namespace(self) -> dict:
        """The store's namespace as a dict."""

    def register(self, tensor: object) -> object:
        """
        Registers a tensor or array with the runtime and the store (no copy) and returns it. Pieces passed to load and store must lie inside registered tensors; the store keeps them alive until unregister.

        Raises tutti.InvalidArgument (not an array), tutti.Unsupported (a memory kind the runtime cannot take).
        """

    def unregister(self, tensor: object) -> None:
        """
        Unregisters a tensor. Raises tutti.Busy while IO using it is in flight.
        """

    def lookup(self, keys: Sequence[bytes]) -> int:
        """
        The number of leading keys whose blocks are visible (the stored prefix, in blocks).
        """

    def load(self, keys: Sequence[bytes], layer: int, destinations: object, blocks: object | None = None) -> KvIo:
        """
        Reads layer `layer` of each key's block in ONE runtime submit and returns a KvIo (wait for it with wait or wait_layer; the bytes are verified there).

        destinations: one registered tensor with blocks= (one block index per key: key k goes to destinations[blocks[k]], split into the namespace's pieces in order), or a list of tensors, one per key and piece (views inside registered tensors). Raises tutti.InvalidArgument / tutti.OutOfRange for bad keys, layer, pieces or alignment (nothing submitted). Per-block failures (NOT_FOUND, DATA_LOSS ...) come in the LayerResult.
        """

    def store(self, keys: Sequence[bytes], layer: int, sources: object, blocks: object | None = None) -> KvIo:
        """
        Writes layer `layer` of each key's block in ONE runtime submit (checksums computed first, GIL released) and returns a KvIo. Sources as load's destinations; they must not change until the wait. Blocks become visible at commit().

        Raises as load, and tutti.Unsupported on a reader, tutti.InvalidArgument for a key repeated in the call.
        """

    def load_layers(self, keys: Sequence[bytes], destinations: object, blocks: object) -> list[KvIo]:
        """
        load() of every layer l into destinations[l] (a list of tensors, one per layer, e.g. vLLM's KV caches), with the same keys and block indices; returns the KvIo of each layer. Then wait_layer(l) as compute reaches layer l.
        """

    def store_layers(self, keys: Sequence[bytes], sources: object, blocks: object) -> list[KvIo]:
        """
        store() of every layer l from sources[l] (one tensor per layer); returns the KvIo of each layer.
        """

    def wait(self, io: KvIo, timeout_s: float, check: bool = True) -> LayerResult:
        """
        Waits at most timeout_s seconds for a KvIo (GIL released, Ctrl-C interrupts), verifies loaded blocks and returns its LayerResult (once: the KvIo is then spent).

        Raises tutti.TimeoutError (wait again), tutti.NotFound (spent or unknown KvIo), tutti.Busy (another thread waits for it); with check=True the first failed block's error, `.result` = the LayerResult.
        """

    def wait_layer(self, layer: int, timeout_s: float, check: bool = True) -> list[LayerResult]:
        """
        Waits for every load and store of `layer` submitted so far and returns their LayerResults in submission order (layer-wise overlap: compute layer l while l+1.. load).

        Raises tutti.TimeoutError (results of those that completed are kept), tutti.InvalidArgument (layer out of range); with check=True the first failed block's error, `.results` = the list.
        """

    def commit(self, keys: Sequence[bytes], timeout_s: float = 60.0, check: bool = True) -> list[BlockResult]:
        """
        Makes the keys' fully stored blocks visible (flush of the written layer files, then one index transaction) and returns a BlockResult per key: OK, NOT_FOUND (never stored), NOT_READY (layers missing: it stays pending) or the failure that dropped the block.

        Raises tutti.TimeoutError (flush not done: commit again), tutti.Unsupported (reader); with check=True the first failed key's error, `.results` = the list.
        """

    def discard(self, keys: Sequence[bytes]) -> None:
        """
        Drops the keys' pending (uncommitted) blocks. Raises tutti.Busy while a layer is in flight.
        """

    def pin(self, keys: Sequence[bytes]) -> None:
        """
        Pins visible blocks (counted) so eviction skips them. Raises tutti.NotFound naming the first key not visible (nothing pinned).
        """

    def unpin(self, keys: Sequence[bytes]) -> None:
        """
        Undoes pin(). Raises tutti.InvalidArgument for a key not pinned (nothing unpinned).
        """

    def evict(self, keys: Sequence[bytes]) -> int:
        """Removes visible, unpinned blocks; returns how many were evicted."""

    def statistics(self) -> dict:
        """
        A snapshot of the store's counters (docs/kv-store.md) as a dict of ints.
        """

    def close(self) -> None:
        """
        Closes the store: waits at most io_timeout_s for its IO, closes the layer files and unregisters the tensors registered through it. Idempotent.
        """

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: object | None, exc: object | None, traceback: object | None) -> bool: ...
