"""Pages of vLLM's KV cache views as bytes: what the stand-in model writes for a block, reading and writing
one block of one layer in memory order, and damaging a stored copy on disk. No vLLM import: the GPU replay
(test_gpu_replay.py) uses these on CUDA tensors."""

from __future__ import annotations

import hashlib
import os

import torch


def page_of(view: torch.Tensor, block: int) -> torch.Tensor:
    """The bytes of one block of one layer's view in memory order, as a flat uint8 tensor (a copy)."""
    b = view[block]
    order = sorted(range(b.dim()), key=lambda d: -b.stride(d))
    return b.permute(*order).contiguous().view(torch.uint8).reshape(-1)


def pattern(key: bytes, layer: int, rank: int, nbytes: int, device="cpu") -> torch.Tensor:
    """What the stand-in model computes for a block: bytes derived from (key, layer, rank)."""
    seed = int.from_bytes(hashlib.sha256(key + bytes([layer, rank])).digest()[:8], "little") >> 1
    golden = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as an int64
    words = torch.arange(nbytes // 8, dtype=torch.int64, device=device) * golden + seed
    return words.view(torch.uint8)


def write_page(view: torch.Tensor, block: int, data: torch.Tensor) -> None:
    """Writes `data` (the page's bytes in memory order) into one block of one layer's view."""
    b = view[block]
    order = sorted(range(b.dim()), key=lambda d: -b.stride(d))
    physical = [b.shape[d] for d in order]
    dense = data.view(view.dtype).view(physical)
    inverse = [order.index(d) for d in range(b.dim())]
    b.copy_(dense.permute(*inverse))


def damage(directory: str, layer: int, needle: torch.Tensor) -> None:
    """Flips one byte of the stored copy of a page (found by its first bytes) in a layer file."""
    path = os.path.join(directory, f"layer-{layer:05d}.kv")
    with open(path, "r+b") as f:
        data = f.read()
        at = data.find(bytes(needle[:256].tolist()))
        assert at >= 0, f"page not found in {path}"
        f.seek(at + 100)
        f.write(bytes([data[at + 100] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
