"""Tutti: move PyTorch tensors and numpy arrays to and from storage with the Tutti C++ runtime.

The classes come from the C++ extension (tutti._tutti); every call is one call of the C++ API, so
Python and C++ users get the same semantics and errors. docs/python.md is the user's page.

    import tutti, torch
    with tutti.Runtime("uring") as rt:
        t = tutti.empty((1024, 1024), torch.float16)           # 4096-byte aligned
        f = rt.open("file:///var/tmp/kv.bin", writable=True)   # the file must exist
        m = rt.register(t)
        rt.submit([(tutti.WRITE, m, 0, f, 0, t.nbytes)]).wait(timeout_s=5)

Units: bytes for sizes and offsets, seconds (float) for timeouts.
"""

from __future__ import annotations

import math as _math

from . import _tutti
from ._tutti import (  # noqa: F401  (re-exported)
    ALIGNMENT,
    Busy,
    DataLoss,
    DeviceError,
    Direction,
    Error,
    InternalError,
    InvalidArgument,
    Io,
    IoResult,
    Memory,
    MemoryKind,
    NotFound,
    NotReady,
    OutOfRange,
    Request,
    RequestResult,
    ResourceExhausted,
    Runtime,
    StatusCode,
    Target,
    TimeoutError,
    Unsupported,
    build_info,
    error_class,
    make_error,
)

READ = Direction.READ
WRITE = Direction.WRITE
FLUSH = Direction.FLUSH

if build_info()["kv_store"]:
    from ._tutti import KvStore, KvIo, LayerResult, BlockResult  # noqa: F401

__version__ = build_info()["version"]


def empty(shape, dtype, device="cpu", *, pin_memory=False, alignment=ALIGNMENT):
    """An uninitialised tensor or array whose data starts on a multiple of `alignment` bytes.

    torch allocates CPU tensors 64-byte aligned and CUDA tensors 256- or 512-byte aligned, numpy
    arrays 64-byte aligned; the uring backend (O_DIRECT) and the KV store need 4096. This allocates
    nbytes + alignment bytes with the framework's own allocator and returns the aligned view (the
    view keeps the allocation alive), so the result is an ordinary tensor or array.

    shape: int or tuple of ints. dtype: a torch.dtype (returns a torch.Tensor on `device`, e.g.
    "cpu" or "cuda:0"; pin_memory=True for page-locked CPU memory) or anything numpy.dtype accepts
    (returns a numpy.ndarray; device must be "cpu"). alignment: bytes, a power of two.
    Raises tutti.InvalidArgument for a negative dimension, a bad alignment, or a numpy dtype with a
    device other than "cpu".
    """
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise make_error(StatusCode.INVALID_ARGUMENT, f"empty: shape = {dims} has a negative dimension")
    if alignment <= 0 or alignment & (alignment - 1):
        raise make_error(StatusCode.INVALID_ARGUMENT, f"empty: alignment = {alignment} is not a power of two")
    count = _math.prod(dims)
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        import torch

        nbytes = count * torch.empty((), dtype=dtype).element_size()
        raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device, pin_memory=pin_memory)
        skip = (-raw.data_ptr()) % alignment
        return raw[skip : skip + nbytes].view(dtype).view(dims)
    import numpy

    if str(device) != "cpu" or pin_memory:
        raise make_error(
            StatusCode.INVALID_ARGUMENT,
            f"empty: device = {device!r}, pin_memory = {pin_memory}: numpy arrays live in "
            "pageable CPU memory; pass a torch.dtype for other devices"
        )
    dt = numpy.dtype(dtype)
    nbytes = count * dt.itemsize
    raw = numpy.empty(nbytes + alignment, dtype=numpy.uint8)
    skip = (-raw.ctypes.data) % alignment
    return raw[skip : skip + nbytes].view(dt).reshape(dims)
