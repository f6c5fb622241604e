"""tutti.lmcache against LMCache's own disk backends, in the same run, on the same file system, through
LMCache's engine API (LMCacheEngine.store / retrieve, LMCache 0.5.x, its configuration objects).

For each prompt length (--tokens) and each backend (--backends) the script builds an LMCacheEngine
whose only disk tier is that backend (local_cpu: false, so LocalCPUBackend is the allocator and
keeps no hot copies: every retrieve reads the disk), stores the KV of one prompt of an 8B-shaped
model (Llama-3-8B: 32 layers, 8 KV heads, head size 128, bf16 = 128 KiB per token, 32 MiB per
256-token chunk), waits until the backend reports every chunk stored, then retrieves it --rounds
times, each with a cold page cache (every file the backend wrote is fsynced, then dropped with
posix_fadvise(POSIX_FADV_DONTNEED)), into a zeroed KV tensor. Every retrieve is verified: the hit
mask covers every token and the retrieved KV equals the stored KV byte for byte; a mismatch exits 1.

Backends:
  tutti                 the plugin, storage_plugins: [tutti] (uring, O_DIRECT, one submit per batch)
  tutti_noverify        the same with verify_on_load: false (no XXH3 of the bytes read; headers checked)
  local_disk            LMCache's LocalDiskBackend as configured by default (buffered IO, no fsync)
  local_disk_odirect    the same with extra_config use_odirect: true
  gds                   LMCache's GdsBackend (gds_path); needs a CUDA device: LMCache asserts a cuda
                        dst_device, so it runs only with --device cuda on a GPU machine (--gds-mode
                        compat = use_gds: false, POSIX IO; cufile = use_gds: true, needs nvidia-fs)

Reported per backend and length: store time (until the backend reports every chunk; local_disk's
puts are then in the page cache, not durable, as it never fsyncs), retrieve time and GB/s (median
of the rounds; the whole LMCache retrieve: lookup, reads, checks, and the copy into the KV tensor),
the backend's own share (its batched_get_blocking, timed around the call) and the ratio of
tutti's retrieve GB/s to each other backend's. Needs the engine environment (scripts/engine-venv)
with tutti installed (pip install .), and a folder on a file system with O_DIRECT (--dir).

    venv=$(scripts/engine-venv)
    "$venv/bin/python" bench/lmcache/compare.py --tokens 4096 --rounds 5
    "$venv/bin/python" bench/lmcache/compare.py --tokens 4096,32768 --device cuda \\
        --backends tutti,local_disk,local_disk_odirect,gds --gds-mode compat --dir /mnt/nvme
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# LMCache's GPU connectors need CUDA and its compiled cuda_ops; the tests' CPU connector copies between
# LMCache's MemoryObjs and a KV tensor on any torch device (python/tests/lmcache/cpu_connector.py).
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests", "lmcache"))

BACKENDS = ("tutti", "tutti_noverify", "local_disk", "local_disk_odirect", "gds")
GIB = 1024**3


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="4096", help="prompt lengths, comma separated (the issue: 4096,32768)")
    p.add_argument("--backends", default="tutti,local_disk,local_disk_odirect",
                   help=f"comma separated, from {', '.join(BACKENDS)}")
    p.add_argument("--rounds", type=int, default=3, help="cold retrieves per backend and length (median reported)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--chunk", type=int, default=256, help="LMCache chunk_size (tokens)")
    p.add_argument("--device", default="cpu", help="where the KV tensor lives: cpu or cuda")
    p.add_argument("--dir", default="/var/tmp", help="parent folder of every backend's files (one file system)")
    p.add_argument("--gds-mode", default="compat", choices=("compat", "cufile"),
                   help="gds backend: compat = use_gds false (POSIX), cufile = use_gds true")
    p.add_argument("--queue-depth", type=int, default=None, help="tutti's uring queue depth (default: the runtime's)")
    p.add_argument("--disk-io-threads", type=int, default=None, help="local_disk's disk_io_threads (default: its own)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def fail(message: str) -> None:
    print(f"compare.py: {message}", file=sys.stderr)
    sys.exit(2)


def drop_cache(folder: str) -> int:
    """fsync then POSIX_FADV_DONTNEED every file under folder; returns the bytes dropped."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def main() -> None:
    args = parse()
    lengths = [int(t) for t in args.tokens.split(",")]
    backends = args.backends.split(",")
    for b in backends:
        if b not in BACKENDS:
            fail(f"--backends: unknown backend {b!r}; known: {', '.join(BACKENDS)}")
    if any(t <= 0 or t % args.chunk for t in lengths):
        fail(f"--tokens = {args.tokens}: each must be a positive multiple of --chunk = {args.chunk}")
    if args.rounds < 1:
        fail(f"--rounds = {args.rounds} must be >= 1")

    import torch

    if "gds" in backends and not args.device.startswith("cuda"):
        fail("backend gds needs --device cuda on a GPU machine: LMCache 0.5.6's GdsBackend asserts a cuda "
             "dst_device (lmcache/v1/storage_backend/gds_backend.py); it cannot run on this CPU machine")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {args.device}: torch sees no CUDA device")

    import tutti.lmcache  # noqa: F401 - checks the LMCache release
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from cpu_connector import CPUKVConnector

    dtype = getattr(torch, args.dtype)
    token_bytes = 2 * args.layers * args.kv_heads * args.head_size * dtype.itemsize
    work = tempfile.mkdtemp(prefix="tutti-lmcache-compare-", dir=args.dir)
    print(f"model shape: {args.layers} layers x {args.kv_heads} KV heads x {args.head_size} x {args.dtype} "
          f"= {token_bytes // 1024} KiB per token, {args.chunk * token_bytes / 2**20:.0f} MiB per chunk; "
          f"device {args.device}; files under {work}")
    rows = []
    ok = True
    try:
        for n in lengths:
            kv_bytes = n * token_bytes
            g = torch.Generator().manual_seed(n)
            tokens = torch.randint(0, 128000, (n,), generator=g)
            kv = torch.randn(2, args.layers, n, args.kv_heads * args.head_size, generator=g).to(dtype)
            kv = kv.to(args.device)
            out = torch.empty_like(kv)
            results = {}
            for backend in backends:
                folder = os.path.join(work, f"{backend}-{n}")
                os.makedirs(folder)
                cpu_gb = (kv_bytes * 1.25 + 256 * 2**20) / GIB
                disk_gb = (kv_bytes * 1.25 + 64 * 2**20) / GIB
                settings = dict(chunk_size=args.chunk, local_cpu=False, max_local_cpu_size=cpu_gb,
                                pre_caching_hash_algorithm="sha256_cbor", save_unfull_chunk=True)
                extra: dict = {}
                if backend.startswith("tutti"):
                    settings["storage_plugins"] = ["tutti"]
                    extra = {"storage_plugin.tutti.module_path": "tutti.lmcache",
                             "storage_plugin.tutti.class_name": "TuttiStorageBackend",
                             "storage_plugin.tutti.path": os.path.join(folder, "rank-{rank}"),
                             "storage_plugin.tutti.capacity_gb": disk_gb}
                    if backend == "tutti_noverify":
                        extra["storage_plugin.tutti.verify_on_load"] = False
                    if args.queue_depth is not None:
                        extra["storage_plugin.tutti.queue_depth"] = args.queue_depth
                    name = "tutti"
                elif backend.startswith("local_disk"):
                    settings.update(local_disk=f"file://{folder}/", max_local_disk_size=disk_gb)
                    extra = {"use_odirect": backend == "local_disk_odirect"}
                    if args.disk_io_threads is not None:
                        extra["disk_io_threads"] = args.disk_io_threads
                    name = "LocalDiskBackend"
                else:
                    settings.update(gds_path=folder, gds_buffer_size=int(kv_bytes * 1.25 / 2**20) + 256,
                                    use_gds=args.gds_mode == "cufile")
                    name = "GdsBackend"
                settings["extra_config"] = extra
                config = LMCacheEngineConfig.from_defaults(**settings)
                metadata = LMCacheMetadata(model_name="bench/8b-shaped", world_size=1, local_world_size=1,
                                           worker_id=0, local_worker_id=0, kv_dtype=dtype,
                                           kv_shape=(args.layers, 2, args.chunk, args.kv_heads, args.head_size),
                                           chunk_size=args.chunk)
                instance = f"compare-{backend}-{n}"
                engine = LMCacheEngineBuilder.get_or_create(instance, config, metadata, CPUKVConnector(metadata),
                                                            broadcast_fn=lambda t, s: None,
                                                            broadcast_object_fn=lambda o, s: o)
                try:
                    engine.post_init()
                    store_backends = engine.storage_manager.storage_backends
                    if name not in store_backends:
                        fail(f"{backend}: LMCache started without it (backends: {list(store_backends)})")
                    target = store_backends[name]
                    keys = [k for _, _, k in engine.token_database.process_tokens(tokens=tokens)]

                    t0 = time.perf_counter()
                    engine.store(tokens, kvcaches=kv)
                    deadline = t0 + 600
                    while not all(target.contains(k) for k in keys) or any(target.exists_in_put_tasks(k)
                                                                            for k in keys):
                        if time.perf_counter() > deadline:
                            fail(f"{backend}: the store did not finish in 600 s")
                        time.sleep(0.001)
                    store_s = time.perf_counter() - t0

                    get_times: list[float] = []
                    real_get = target.batched_get_blocking

                    def timed_get(ks, real_get=real_get, get_times=get_times):
                        s = time.perf_counter()
                        try:
                            return real_get(ks)
                        finally:
                            get_times.append(time.perf_counter() - s)

                    target.batched_get_blocking = timed_get
                    retrieve_s, backend_s, dropped = [], [], 0
                    for _ in range(args.rounds):
                        dropped = drop_cache(folder)
                        out.zero_()
                        if out.is_cuda:
                            torch.cuda.synchronize(out.device)
                        get_times.clear()
                        s = time.perf_counter()
                        mask = engine.retrieve(tokens, kvcaches=out)
                        if out.is_cuda:
                            torch.cuda.synchronize(out.device)
                        retrieve_s.append(time.perf_counter() - s)
                        backend_s.append(sum(get_times))
                        hit = int(mask.sum())
                        same = bool(torch.equal(out, kv))
                        if hit != n or not same:
                            print(f"MISMATCH {backend} {n} tokens: {hit} of {n} tokens retrieved, bytes equal: {same}")
                            ok = False
                    r = statistics.median(retrieve_s)
                    b = statistics.median(backend_s)
                    results[backend] = {
                        "backend": backend, "tokens": n, "kv_bytes": kv_bytes, "store_s": store_s,
                        "store_gbps": kv_bytes / store_s / 1e9, "retrieve_s": r, "retrieve_gbps": kv_bytes / r / 1e9,
                        "backend_get_s": b, "backend_get_gbps": kv_bytes / b / 1e9 if b > 0 else None,
                        "rounds": args.rounds, "verified_bytes": kv_bytes * args.rounds if ok else 0,
                        "file_bytes_dropped": dropped, "durable_at_store_end": backend.startswith("tutti"),
                    }
                    print(f"{backend:>19} {n:>6} tokens: store {store_s * 1e3:8.1f} ms "
                          f"({kv_bytes / store_s / 1e9:5.2f} GB/s), retrieve {r * 1e3:8.1f} ms "
                          f"({kv_bytes / r / 1e9:5.2f} GB/s; backend get {b * 1e3:8.1f} ms), "
                          f"{args.rounds} x {kv_bytes / 2**20:.0f} MiB verified", flush=True)
                finally:
                    LMCacheEngineBuilder.destroy(instance)
                    gc.collect()
                    shutil.rmtree(folder, ignore_errors=True)
            if "tutti" in results:
                t = results["tutti"]
                for other, res in results.items():
                    if other == "tutti":
                        continue
                    t[f"retrieve_ratio_vs_{other}"] = t["retrieve_gbps"] / res["retrieve_gbps"]
                    t[f"store_ratio_vs_{other}"] = t["store_gbps"] / res["store_gbps"]
                    ratio_r, ratio_s = t[f"retrieve_ratio_vs_{other}"], t[f"store_ratio_vs_{other}"]
                    print(f"{'':>19} {n:>6} tokens: tutti / {other}: retrieve GB/s x{ratio_r:.2f}, "
                          f"store GB/s x{ratio_s:.2f}")
            rows.extend(results.values())
            del kv, out
            gc.collect()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rows": rows}, f, indent=2)
    if not ok:
        print("compare.py: a retrieve returned wrong or missing bytes", file=sys.stderr)
        sys.exit(1)
    sys.stdout.flush()
    os._exit(0)  # LMCache's background threads (its event loop) would keep the interpreter alive


if __name__ == "__main__":
    main()
