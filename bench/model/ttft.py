#!/usr/bin/env python3
"""Time to first token on a real transformer: restore a long prefix's KV cache from storage through
Tutti's KV block store, or recompute it. docs/kv-cache.md ("Restore or recompute: time to first
token on a transformer") is the user's page; figures are in docs/benchmarks.md.

For each model shape (data/model_shapes.json; a Llama-family decoder built by transformers from a
config, random weights, bf16), this program

1. prefills the longest prefix (default 32768 tokens) and captures the KV cache the prefill produced
   (transformers' DynamicCache, per layer K and V);
2. stores it layer by layer through tutti.KvStore over the uring backend (io_uring, O_DIRECT) under
   --dir, one key per block of --block-tokens tokens (chained prefix hashes), and commits it; a
   shorter prefix is the leading blocks of the same chain, as in a prefix cache;
3. times (--quick: 2 repeats, the whole matrix in about 6 minutes on the H200), for a request of
   each prefix (4k, 8k, 16k, 32k) plus a --suffix of 256 new tokens, the
   time to first token (request in -> the first generated token's id on the host) of
     recompute  the full prefill of prefix + suffix;
     tutti      KvStore.lookup + load_layers, then the suffix's forward pass, whose layer L waits
                for KvStore.wait_layer(L) (every block's XXH3-64 verified) while L+1... load;
     cufile     the same overlapped restore through cuFileRead (compat mode without nvidia-fs);
     kvikio     the same through KvikIO (kvikio.CuFile.pread);
     pread      the same through pread (O_DIRECT) + cudaMemcpy;
     resident   the suffix's forward pass with the prefill's KV already in GPU memory (no IO): the
                floor of every restore, and the reference of the logit check;
   and the disk's limit for the same bytes (O_DIRECT reads at queue depth 32, readers.disk_limit).
   The page cache is dropped before every run (as root); every reader uses O_DIRECT, and each run
   counts the bytes the block device under --dir delivered (/sys/dev/block/M:m/stat): a run that
   restored more bytes than the device read fails. Methods are interleaved, their order rotating,
   over --repeats repeats; figures are the median with min and max.
4. checks (the pass rules) that every restored byte equals the prefill's KV (destinations are
   poisoned before each run), that the store verified every block's checksum, that every restore's
   first-token logits equal the resident run's bit for bit, and that they are within --logit-rtol
   (relative L2 norm, 0.2) of recompute's; the argmax agreement is information (random weights).
5. reports TTFT per method and prefix with ratios, restore GB/s against the disk's limit, the IO
   hidden behind compute (CUDA events), the break-even drive bandwidth (measured here, and projected
   from the measured per-layer compute for one and four 14 GB/s PCIe Gen5 drives), writes
   OUT/ttft.json (after every prefix, so a cut-short run keeps what it measured), OUT/ttft.png and
   OUT/ttft.md (the tables of docs/benchmarks.md, filled).

`ttft.py --report-from OUT/ttft.json [--out DIR]` renders ttft.md, ttft.png and the console report
again from a run's JSON (the GPU machine has no matplotlib: make the plot here).

Exit status: 0 when every check passed, 1 when one failed, 2 for bad options (nothing is run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SHAPES = os.path.join(HERE, "..", "..", "data", "model_shapes.json")
METHODS = ("recompute", "resident", "tutti", "cufile", "kvikio", "pread")
RESTORE_METHODS = ("tutti", "cufile", "kvikio", "pread")
DISK = "disk-qd32"
T0 = time.perf_counter()


def log(message: str) -> None:
    line = f"[{time.perf_counter() - T0:7.1f} s] {message}"
    print(line, flush=True)
    if LOG_FILE is not None:
        LOG_FILE.write(line + "\n")
        LOG_FILE.flush()


LOG_FILE = None


class BadOption(Exception):
    pass


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise BadOption(f"{flag} = {text!r}: not a comma-separated list of integers") from e
    if not values:
        raise BadOption(f"{flag} is empty")
    return values


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="ttft-out",
                   help="output folder: ttft.json, ttft.md, ttft.png, ttft.log (default ttft-out)")
    p.add_argument("--dir", default="/var/tmp/tutti-ttft",
                   help="where the KV stores are created (one folder per model, removed after it; a file system\n"
                        "that takes O_DIRECT; default /var/tmp/tutti-ttft)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="the model shapes file (default data/model_shapes.json)")
    p.add_argument("--models", default="llama-3-8b,llama-3-70b:40",
                   help="NAME[:LAYERS],... from the shapes file; LAYERS overrides the layer count\n"
                        "(default llama-3-8b,llama-3-70b:40: the 8B shape, and 40 layers of the 70B shape)")
    p.add_argument("--prefixes", default="4096,8192,16384,32768", help="prefix lengths in tokens (default 4k..32k)")
    p.add_argument("--suffix", type=int, default=256, help="new tokens after the prefix (default 256)")
    p.add_argument("--block-tokens", type=int, default=256, help="tokens per KV block, one store key each (256)")
    p.add_argument("--repeats", type=int, default=None,
                   help="interleaved repeats per method and prefix (default 3; 2 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="the whole matrix (both models, every prefix, every method) in about 6 minutes on the\n"
                        "H200 with its 1.5 GB/s disk: --repeats 2 and --time-budget-s 300 unless given")
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)} (default: all)")
    p.add_argument("--no-disk-limit", action="store_true", help="skip the O_DIRECT queue-depth-32 limit reads")
    p.add_argument("--queue-depth", type=int, default=32,
                   help="reads in flight for tutti (staging buffers), cuFile and KvikIO (threads) and the disk\n"
                        "limit (default 32)")
    p.add_argument("--pread-threads", type=int, default=1, help="threads of the pread + cudaMemcpy method (1)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="auto: cuda when available")
    p.add_argument("--drop-caches", default="auto", choices=("auto", "on", "off"),
                   help="drop the page cache before every run (auto: when root)")
    p.add_argument("--drive-gbps", default="14,56",
                   help="drive bandwidths (GB/s) to project TTFT for (default 14,56: one and four PCIe Gen5\n"
                        "drives)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="no new repeat (after the first) and no new prefix of it starts past this many seconds,\n"
                        "shared by the models in proportion to their KV bytes per token (420; 300 with --quick)")
    p.add_argument("--logit-rtol", type=float, default=0.2,
                   help="the check of the first token's logits against recompute's: ||restored - recomputed||_2\n"
                        "/ ||recomputed||_2 at most this (default 0.2: bf16 rounding of differently shaped\n"
                        "products; a gross error such as another layer's KV, not a shuffled block order)")
    p.add_argument("--io-timeout-s", type=float, default=300.0, help="bound of every wait for a layer (300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the token ids (0)")
    p.add_argument("--keep-files", action="store_true", help="keep the stores under --dir")
    p.add_argument("--inject-damage", action="store_true",
                   help="self-test of the checks: flip one stored byte on disk after the commit; the run must\n"
                        "then fail (the store refuses the block, the byte comparison catches the other readers)")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 3
    if args.time_budget_s is None:
        args.time_budget_s = 300.0 if args.quick else 420.0
    args.prefix_list = sorted(set(int_list(args.prefixes, "--prefixes")))
    args.drive_list = [float(v) for v in args.drive_gbps.split(",") if v.strip()]
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in args.method_list:
        if m not in METHODS:
            raise BadOption(f"--methods: unknown method {m!r}; known: {', '.join(METHODS)}")
    if not args.method_list:
        raise BadOption("--methods is empty")
    for name, value, low in (("--suffix", args.suffix, 1), ("--block-tokens", args.block_tokens, 1),
                             ("--repeats", args.repeats, 1), ("--queue-depth", args.queue_depth, 1),
                             ("--pread-threads", args.pread_threads, 1)):
        if value < low:
            raise BadOption(f"{name} = {value}: must be at least {low}")
    if args.queue_depth > 1024 or args.pread_threads > 1024:
        raise BadOption("--queue-depth and --pread-threads: at most 1024 threads")
    for prefix in args.prefix_list:
        if prefix <= 0 or prefix % args.block_tokens:
            raise BadOption(f"--prefixes: {prefix} is not a positive multiple of --block-tokens {args.block_tokens}")
    if any(not (g > 0) for g in args.drive_list):
        raise BadOption(f"--drive-gbps = {args.drive_gbps!r}: every value must be > 0")
    if not (args.time_budget_s > 0) or not (args.io_timeout_s > 0):
        raise BadOption("--time-budget-s and --io-timeout-s must be > 0")
    if not (0 < args.logit_rtol < 1):
        raise BadOption(f"--logit-rtol = {args.logit_rtol:g}: must be in (0, 1)")
    return args


def load_shapes(args) -> list[tuple[str, int, dict, dict]]:
    """[(name, layers, shape, dtype entry)] for --models, validated against the shapes file."""
    try:
        with open(args.shapes) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise BadOption(f"--shapes {args.shapes}: {e}") from e
    models = data.get("models", {})
    out = []
    for item in (m.strip() for m in args.models.split(",") if m.strip()):
        name, _, layers_text = item.partition(":")
        if name not in models:
            raise BadOption(f"--models: {name!r} is not in {args.shapes}; known: {', '.join(models)}")
        shape = models[name]
        for field in ("layers", "attention_heads", "kv_heads", "head_dim", "hidden_size", "intermediate_size",
                      "vocab_size", "rope_theta", "dtype"):
            if field not in shape:
                raise BadOption(f"{args.shapes}: model {name!r} lacks {field!r} (needed to build it)")
        layers = shape["layers"]
        if layers_text:
            try:
                layers = int(layers_text)
            except ValueError as e:
                raise BadOption(f"--models: {item!r}: LAYERS must be an integer") from e
        if layers < 1:
            raise BadOption(f"--models: {item!r}: LAYERS must be at least 1")
        dtype = data.get("dtypes", {}).get(shape["dtype"])
        if dtype is None or "torch" not in dtype:
            raise BadOption(f"{args.shapes}: dtype {shape['dtype']!r} of {name!r} has no torch name")
        piece = shape["kv_heads"] * args.block_tokens * shape["head_dim"] * dtype["bytes"]
        if piece % 4096:
            raise BadOption(f"{name}: a K or V piece of {args.block_tokens} tokens is {piece} bytes, not a multiple "
                            "of 4096 (O_DIRECT): pick another --block-tokens")
        out.append((name, layers, shape, dtype))
    if not out:
        raise BadOption("--models is empty")
    return out


def clip(text: str, limit: int = 800) -> str:
    """One line of at most `limit` characters (library errors can list whole directories)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


class ReadCounters:
    """Bytes the storage actually delivered: the sectors read by the block device under --dir
    (/sys/dev/block/MAJ:MIN/stat, field 3, 512-byte sectors; machine-wide, so other readers can only
    add) and this process's read_bytes (/proc/self/io: bytes its threads, io_uring's workers among
    them, submitted to the block layer). Neither moves when the page cache serves a read, so a
    restore of N bytes that moved fewer than N through them was not read from the disk."""

    def __init__(self, directory: str):
        self.stat_path, self.device = None, None
        try:
            st = os.stat(directory)
            major, minor = os.major(st.st_dev), os.minor(st.st_dev)
            path = f"/sys/dev/block/{major}:{minor}/stat"
            if os.path.exists(path):
                self.stat_path = path
                self.device = os.path.basename(os.path.realpath(f"/sys/dev/block/{major}:{minor}"))
        except OSError:
            pass

    def read(self) -> dict:
        out = {"device": None, "process": None}
        if self.stat_path is not None:
            try:
                with open(self.stat_path) as f:
                    out["device"] = int(f.read().split()[2]) * 512
            except (OSError, ValueError, IndexError):
                pass
        try:
            with open("/proc/self/io") as f:
                for line in f:
                    if line.startswith("read_bytes:"):
                        out["process"] = int(line.split()[1])
        except (OSError, ValueError):
            pass
        return out

    @staticmethod
    def delta(before: dict, after: dict) -> dict:
        return {f"{k}_read_bytes": (None if before[k] is None or after[k] is None else after[k] - before[k])
                for k in ("device", "process")}


def open_descriptors(directory: str) -> list[dict]:
    """Every descriptor of this process open on a file under `directory`, with its O_DIRECT flag
    (the octal flags of /proc/self/fdinfo against os.O_DIRECT)."""
    direct = getattr(os, "O_DIRECT", 0o40000)
    real = os.path.realpath(directory) + os.sep
    out = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if not target.startswith(real):
                continue
            with open(f"/proc/self/fdinfo/{name}") as f:
                flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        out.append({"fd": int(name), "file": os.path.relpath(target, real), "o_direct": bool(flags & direct),
                    "writable": bool(flags & (os.O_WRONLY | os.O_RDWR))})
    return sorted(out, key=lambda d: d["fd"])


def logit_comparison(logits, ref) -> dict:
    """The first token's logits (fp32) against a reference's: max |diff|, ||diff||_2 / ||ref||_2,
    cosine similarity, and whether the argmax agrees."""
    diff = logits - ref
    norm = float(ref.norm())
    return {"max_abs_diff": float(diff.abs().max()), "rel_l2": float(diff.norm()) / norm if norm > 0 else 0.0,
            "cosine": float((logits @ ref) / (logits.norm() * ref.norm()).clamp_min(1e-30)),
            "argmax_agrees": int(logits.argmax()) == int(ref.argmax())}


class Context:
    """What every model's run shares: options, torch, the device, the drop-caches switch, results."""

    def __init__(self, args):
        import torch

        import tutti

        self.args, self.torch, self.tutti = args, torch, tutti
        if args.device == "auto":
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.device == "cuda" and not torch.cuda.is_available():
            raise BadOption("--device cuda: torch sees no CUDA device")
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        self.drop = args.drop_caches == "on" or (args.drop_caches == "auto" and os.geteuid() == 0)
        self.drop_note = "page cache dropped before every run" if self.drop else "page cache NOT dropped"
        self.failures: list[str] = []
        self.deadline = T0 + args.time_budget_s

    def drop_caches(self) -> None:
        if not self.drop:
            return
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError as e:
            self.drop = False
            self.drop_note = f"page cache NOT dropped: writing /proc/sys/vm/drop_caches failed ({e})"
            log(self.drop_note)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def fail(self, message: str) -> None:
        self.failures.append(message)
        log("CHECK FAILED: " + message)


def environment(ctx) -> dict:
    torch = ctx.torch
    import transformers

    env = {"python": platform.python_version(), "kernel": platform.release(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "tutti": ctx.tutti.build_info(), "device": str(ctx.device), "page_cache": ctx.drop_note}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    try:
        st = os.statvfs(ctx.args.dir if os.path.isdir(ctx.args.dir) else os.path.dirname(ctx.args.dir.rstrip("/")))
        env["dir_free_gib"] = round(st.f_bavail * st.f_frsize / 2**30, 1)
    except OSError:
        pass
    try:  # the file system and device under --dir
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
        target = os.path.realpath(ctx.args.dir if os.path.exists(ctx.args.dir) else os.path.dirname(ctx.args.dir))
        best = max((m for m in mounts if target.startswith(m[1])), key=lambda m: len(m[1]), default=None)
        if best:
            env["dir_filesystem"] = {"source": best[0], "mount": best[1], "type": best[2]}
    except OSError:
        pass
    return env


def measure_h2d(ctx) -> float | None:
    """Pinned host -> device copy rate (GB/s, best of 5 copies of 1 GiB): the cap of any restore."""
    if not ctx.cuda:
        return None
    torch = ctx.torch
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device=ctx.device)
    best = 0.0
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        best = max(best, (1 << 30) / (start.elapsed_time(end) / 1e3) / 1e9)
    del host, dev
    return best


class ModelRun:
    """One model shape: build, prefill, store, prepare the readers, then the timed runs."""

    def __init__(self, ctx, name: str, layers: int, shape: dict, dtype_entry: dict):
        self.ctx, self.name, self.layers, self.shape = ctx, name, layers, shape
        self.torch = ctx.torch
        self.dtype = getattr(self.torch, dtype_entry["torch"])
        self.dtype_bytes = dtype_entry["bytes"]
        args = ctx.args
        self.bt, self.suffix = args.block_tokens, args.suffix
        self.prefixes = args.prefix_list
        self.kv_heads, self.head_dim = shape["kv_heads"], shape["head_dim"]
        self.piece_bytes = self.kv_heads * self.bt * self.head_dim * self.dtype_bytes
        self.slot_bytes = 2 * self.piece_bytes
        self.nb_max = max(self.prefixes) // self.bt
        self.kv_bytes_per_token = layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes
        self.directory = os.path.join(args.dir, f"{name}-{layers}")
        self.stream = self.torch.cuda.Stream(self.ctx.device) if ctx.cuda else None
        self.readers, self.unavailable = {}, {}
        self.result = {"name": name, "layers": layers, "shape_layers": shape["layers"], "dtype": shape["dtype"],
                       "hidden_size": shape["hidden_size"], "attention_heads": shape["attention_heads"],
                       "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                       "intermediate_size": shape["intermediate_size"], "vocab_size": shape["vocab_size"],
                       "block_tokens": self.bt, "piece_bytes": self.piece_bytes, "suffix_tokens": self.suffix,
                       "kv_bytes_per_token": self.kv_bytes_per_token, "methods": {}, "prefixes": [],
                       "skipped": None}
        self.runs = {p: [] for p in self.prefixes}
        self.logits = {}  # (repeat, prefix, method) -> fp32 logits

    # -- setup ---------------------------------------------------------------------------------
    def check_memory(self) -> None:
        if not self.ctx.cuda:
            return
        torch = self.torch
        s = self.shape
        params = (2 * s["vocab_size"] * s["hidden_size"] + self.layers * (
            s["hidden_size"] * s["head_dim"] * (2 * s["attention_heads"] + 2 * self.kv_heads)
            + 3 * s["hidden_size"] * s["intermediate_size"]))
        tokens = max(self.prefixes) + self.suffix
        need = (params * self.dtype_bytes + 4 * tokens * self.kv_bytes_per_token
                + 6 * tokens * s["intermediate_size"] * self.dtype_bytes + (2 << 30))
        free, _ = torch.cuda.mem_get_info(self.ctx.device)
        self.result["memory_estimate_gib"] = round(need / 2**30, 1)
        if need > free:
            raise MemoryError(f"{self.name} with {self.layers} layers needs about {need / 2**30:.0f} GiB of GPU memory "
                              f"(weights, 4 copies of the KV, activations) and {free / 2**30:.0f} GiB are free: lower "
                              "the layer count (NAME:LAYERS) or --prefixes")

    def build(self) -> None:
        import kvmodel

        torch, ctx = self.torch, self.ctx
        t = time.perf_counter()
        self.model, _ = kvmodel.build_model(self.shape, self.layers, max(self.prefixes) + self.suffix, ctx.device,
                                            self.dtype, ctx.args.seed)
        counts = kvmodel.parameter_counts(self.model)
        self.result["parameters"] = counts
        self.non_embedding = counts["non_embedding"]
        log(f"{self.name}: built {self.layers} layers, {counts['total'] / 1e9:.3g} B parameters "
            f"({counts['non_embedding'] / 1e9:.3g} B outside the embedding and LM head), random weights, "
            f"{self.shape['dtype']} on {ctx.device} in {time.perf_counter() - t:.1f} s")
        g = torch.Generator().manual_seed(ctx.args.seed + 1)
        vocab = self.shape["vocab_size"]
        self.prefix_ids = torch.randint(0, vocab, (max(self.prefixes),), generator=g).to(ctx.device)
        self.suffix_ids = torch.randint(0, vocab, (self.suffix,), generator=g).to(ctx.device)
        self.keys = kvmodel.block_keys(f"{self.name}:{self.layers}:seed{ctx.args.seed}", self.prefix_ids, self.bt)

    def flops(self, past: int, new: int) -> float:
        import kvmodel

        return kvmodel.forward_flops(self.non_embedding, self.layers, self.shape["attention_heads"],
                                     self.head_dim, past, new)

    def prefill_and_store(self) -> None:
        import kvmodel

        torch, ctx, tutti = self.torch, self.ctx, self.ctx.tutti
        layers, nb = self.layers, self.nb_max
        block_shape = (nb, 2, self.kv_heads, self.bt, self.head_dim)
        device = str(ctx.device)
        t = time.perf_counter()
        out = kvmodel.first_token(self.model, self.prefix_ids, 0, None, self.stream)
        prefill_s = time.perf_counter() - t
        self.ref = [tutti.empty(block_shape, self.dtype, device=device) for _ in range(layers)]
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            for layer in range(layers):
                cached = out["cache"].layers[layer]
                kvmodel.blockify_into(self.ref[layer], cached.keys, cached.values, self.bt)
        ctx.sync()
        del out
        if ctx.cuda:
            torch.cuda.empty_cache()
        self.kvbuf = [tutti.empty(block_shape, self.dtype, device=device) for _ in range(layers)]
        kv_bytes = nb * self.bt * self.kv_bytes_per_token
        log(f"{self.name}: prefilled {nb * self.bt} tokens in {prefill_s:.2f} s (first run, includes warm-up); "
            f"KV {kv_bytes / 2**30:.2f} GiB in {nb} blocks x {layers} layers of {self.slot_bytes >> 10} KiB")

        shutil.rmtree(self.directory, ignore_errors=True)
        os.makedirs(os.path.dirname(self.directory.rstrip("/")) or ".", exist_ok=True)
        requests = layers * nb * 2
        queue_depth = 256
        while queue_depth < requests and queue_depth < 32768:
            queue_depth *= 2
        if requests > queue_depth:
            log(f"{self.name}: {requests} reads per restore exceed the uring queue depth limit of 32768: the store "
                "resubmits the rest as layers are waited for (less overlap)")
        self.runtime = tutti.Runtime("uring", queue_depth=queue_depth, staging_buffers=ctx.args.queue_depth,
                                     staging_buffer_bytes=self.piece_bytes)
        namespace = {"model": f"{self.name}:{layers}-layers:random-seed-{ctx.args.seed}",
                     "dtype": self.shape["dtype"], "block_tokens": self.bt, "layers": layers,
                     "piece_bytes": [self.piece_bytes, self.piece_bytes], "kv_split": True, "tensor_layout": "HND",
                     "hash_algorithm": "sha256"}
        t = time.perf_counter()
        self.store = tutti.KvStore(self.runtime, self.directory, namespace,
                                   capacity_bytes=layers * nb * self.slot_bytes, io_timeout_s=ctx.args.io_timeout_s)
        create_s = time.perf_counter() - t
        for tensor in self.ref + self.kvbuf:
            self.store.register(tensor)
        self.counters = ReadCounters(self.directory)
        t = time.perf_counter()
        self.store.store_layers(self.keys, self.ref, blocks=list(range(nb)))
        stored = 0
        for layer in range(layers):
            for r in self.store.wait_layer(layer, timeout_s=ctx.args.io_timeout_s):
                stored += r.bytes
        self.store.commit(self.keys, timeout_s=ctx.args.io_timeout_s)
        store_s = time.perf_counter() - t
        hits = self.store.lookup(self.keys)
        if stored != layers * nb * self.slot_bytes or hits != nb:
            raise RuntimeError(f"store: {stored} bytes stored and {hits} of {nb} blocks visible after commit")
        for tensor in self.ref:
            self.store.unregister(tensor)
        self.result["store"] = {"create_s": create_s, "store_and_commit_s": store_s, "bytes": stored,
                                "gbps": stored / store_s / 1e9, "uring_queue_depth": queue_depth,
                                "staging_buffers": ctx.args.queue_depth, "staging_buffer_bytes": self.piece_bytes,
                                "directory": self.directory}
        log(f"{self.name}: stored and committed {stored / 2**30:.2f} GiB through tutti.KvStore (uring, O_DIRECT) in "
            f"{store_s:.1f} s = {stored / store_s / 1e9:.2f} GB/s (store files created in {create_s:.1f} s)")
        self.check_slot_layout()
        if ctx.args.inject_damage:
            self.inject_damage()

    def inject_damage(self) -> None:
        import readers

        path = readers.layer_path(self.directory, self.layers - 1)
        fd = os.open(path, os.O_RDWR)
        try:
            byte = os.pread(fd, 1, 100)
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), 100)
            os.fsync(fd)
        finally:
            os.close(fd)
        log(f"{self.name}: --inject-damage: flipped byte 100 of block 0 in {path}: every restore must now fail")

    def check_slot_layout(self) -> None:
        """The other readers read slot b of each layer file as block b: check it on the first and last
        block of the first and last layer before trusting it."""
        import numpy

        import readers

        tutti = self.ctx.tutti
        buf = tutti.empty(self.slot_bytes, numpy.uint8)
        for layer in sorted({0, self.layers - 1}):
            fd = os.open(readers.layer_path(self.directory, layer), os.O_RDONLY | os.O_DIRECT)
            try:
                for block in sorted({0, self.nb_max - 1}):
                    readers._pread_full(fd, buf, block * self.slot_bytes)
                    expected = self.ref[layer][block].contiguous().view(self.torch.uint8).reshape(-1).cpu().numpy()
                    if not numpy.array_equal(buf, expected):
                        self.slot_layout_ok = False
                        return
            finally:
                os.close(fd)
        self.slot_layout_ok = True

    def prepare_readers(self) -> None:
        import readers

        args = self.ctx.args
        io_bytes = self.piece_bytes
        wanted = [m for m in args.method_list if m in RESTORE_METHODS]
        for method in wanted:
            if method != "tutti" and not self.slot_layout_ok:
                self.unavailable[method] = "the store's layer files do not hold block b in slot b (layout check)"
                continue
            if method == "tutti":
                reader = readers.TuttiReader(self.store, self.keys, args.io_timeout_s)
                reader.detail = (f"KvStore over uring (O_DIRECT, staging {args.queue_depth} x {io_bytes} B into GPU "
                                 f"memory), one submit per layer, every block's XXH3-64 verified" if self.ctx.cuda
                                 else "KvStore over uring (O_DIRECT), one submit per layer, XXH3-64 verified")
            elif method == "cufile":
                reader = readers.CuFileReader(self.directory, self.layers, self.slot_bytes, io_bytes,
                                              args.queue_depth, args.io_timeout_s, args.out)
            elif method == "kvikio":
                reader = readers.KvikioReader(self.directory, self.layers, self.slot_bytes, io_bytes,
                                              args.queue_depth, args.io_timeout_s)
            else:
                reader = readers.PreadReader(self.directory, self.layers, self.slot_bytes, io_bytes,
                                             args.pread_threads, args.io_timeout_s)
            try:
                reader.prepare(self.kvbuf)
            except readers.Unavailable as e:
                self.unavailable[method] = clip(str(e))
                continue
            except Exception as e:  # noqa: BLE001  (a library that fails to set up: not measured, said why)
                self.unavailable[method] = clip(f"{type(e).__name__}: {e}")
                continue
            self.readers[method] = reader
        for method in wanted:
            entry = {"measured": method in self.readers}
            if method in self.readers:
                entry["detail"] = self.readers[method].detail
            else:
                entry["not_measured"] = self.unavailable[method]
                log(f"{self.name}: {method}: not measured: {self.unavailable[method]}")
            self.result["methods"][method] = entry
        if "recompute" in args.method_list:
            self.result["methods"]["recompute"] = {"measured": True, "detail": "full prefill of prefix + suffix "
                                                   "(transformers, SDPA attention), LM head on the last token"}
        if "resident" in args.method_list:
            self.result["methods"]["resident"] = {"measured": True, "detail": "the suffix's forward pass with the "
                                                  "prefill's KV already in memory (no IO): the floor of any restore"}

    # -- runs ----------------------------------------------------------------------------------
    def run_recompute(self, prefix: int, repeat: int, keep: bool) -> dict:
        import kvmodel

        torch = self.torch
        ids = torch.cat([self.prefix_ids[:prefix], self.suffix_ids])
        self.ctx.sync()
        self.ctx.drop_caches()
        marks = kvmodel.Marks(self.stream)
        t0 = time.perf_counter()
        out = kvmodel.first_token(self.model, ids, 0, None, self.stream, marks)
        run = {"method": "recompute", "repeat": repeat, "ttft_s": out["t_token"] - t0,
               "gpu_s": marks.elapsed(out["start"], out["end"]), "token": out["token"]}
        if keep:
            self.logits[(repeat, prefix, "recompute")] = out["logits"]
        if repeat == 0:  # information: the recomputed prefix KV against the stored prefill's
            nb = prefix // self.bt
            diff = 0.0
            for layer in range(self.layers):
                cached = out["cache"].layers[layer]
                ref = self.ref[layer][:nb]
                k = ref[:, 0].permute(1, 0, 2, 3).reshape(1, self.kv_heads, prefix, self.head_dim)
                v = ref[:, 1].permute(1, 0, 2, 3).reshape(1, self.kv_heads, prefix, self.head_dim)
                diff = max(diff, (cached.keys[:, :, :prefix].float() - k.float()).abs().max().item(),
                           (cached.values[:, :, :prefix].float() - v.float()).abs().max().item())
            run["prefix_kv_max_abs_diff_vs_stored"] = diff
        del out
        return run

    def run_resident(self, prefix: int, repeat: int, keep: bool) -> dict:
        """The suffix's forward pass with the prefix's KV already in GPU memory (the prefill's own KV,
        laid out by the same RestoringLayer code with a gate that never waits): what a prefix-cache hit
        in GPU memory costs, the floor of every restore, and the reference its logits must equal."""
        import kvmodel

        blocks = prefix // self.bt
        self.ctx.sync()
        marks = kvmodel.Marks(self.stream)
        gate = kvmodel.LayerGate(lambda layer: None, self.layers, marks)
        cache = kvmodel.restoring_cache(self.layers, self.ref, blocks, gate)
        t0 = time.perf_counter()
        out = kvmodel.first_token(self.model, self.suffix_ids, prefix, cache, self.stream, marks)
        L = self.layers
        run = {"method": "resident", "repeat": repeat, "ttft_s": out["t_token"] - t0,
               "gpu_s": marks.elapsed(out["start"], out["end"]), "token": out["token"],
               "compute_head_s": marks.elapsed(out["start"], gate.before[0]),
               "compute_layers_s": [marks.elapsed(gate.after[i], gate.before[i + 1]) for i in range(L - 1)],
               "compute_tail_s": marks.elapsed(gate.after[L - 1], out["end"])}
        if keep:
            self.logits[(repeat, prefix, "resident")] = out["logits"]
        del out, cache
        return run

    def check_logits(self, prefix: int, repeat: int) -> None:
        """After every method of one (repeat, prefix) ran. The pass rules: every restore's first-token
        logits equal the resident run's bit for bit (the same KV bytes and the same computation: a
        layer read before its bytes landed shows here), and every run's logits are within
        --logit-rtol of recompute's (relative L2 norm of the difference)."""
        torch, rtol = self.torch, self.ctx.args.logit_rtol
        got = {m: l for (r, p, m), l in self.logits.items() if r == repeat and p == prefix}
        resident = got.get("resident")
        for method in RESTORE_METHODS:
            if method in got and resident is not None and not torch.equal(got[method], resident):
                diff = float((got[method] - resident).abs().max())
                self.ctx.fail(f"{self.name} {prefix} tokens, {method}, repeat {repeat}: the first token's logits "
                              f"differ from the resident KV's by up to {diff:.3g} (they must be bit-identical)")
        recompute = got.get("recompute")
        if recompute is None:
            return
        for method, logits in got.items():
            if method == "recompute":
                continue
            c = logit_comparison(logits, recompute)
            if not c["rel_l2"] <= rtol:
                self.ctx.fail(f"{self.name} {prefix} tokens, {method}, repeat {repeat}: the first token's logits are "
                              f"{c['rel_l2']:.3g} away from recompute's (relative L2; --logit-rtol {rtol:g}; max abs "
                              f"diff {c['max_abs_diff']:.3g})")

    def poison(self, blocks: int) -> None:
        for t in self.kvbuf:
            t[:blocks].view(self.torch.uint8).fill_(0xA5)
        self.ctx.sync()

    def mismatched_blocks(self, blocks: int) -> int:
        torch = self.torch
        bad = 0
        for layer in range(self.layers):
            got = self.kvbuf[layer][:blocks].view(torch.uint8)
            want = self.ref[layer][:blocks].view(torch.uint8)
            if not torch.equal(got, want):
                bad += int((got != want).reshape(blocks, -1).any(dim=1).sum().item())
        return bad

    def run_restore(self, method: str, prefix: int, repeat: int, keep: bool) -> dict:
        import kvmodel

        reader = self.readers[method]
        blocks = prefix // self.bt
        self.poison(blocks)
        self.ctx.drop_caches()
        marks = kvmodel.Marks(self.stream)
        gate = kvmodel.LayerGate(reader.wait_layer, self.layers, marks)
        cache = kvmodel.restoring_cache(self.layers, self.kvbuf, blocks, gate)
        counted = self.counters.read()
        t0 = time.perf_counter()
        reader.start(blocks)
        out = kvmodel.first_token(self.model, self.suffix_ids, prefix, cache, self.stream, marks)
        ttft = out["t_token"] - t0
        stats = reader.finish()
        moved = ReadCounters.delta(counted, self.counters.read())
        L = self.layers
        stalls = [marks.elapsed(gate.before[i], gate.after[i]) for i in range(L)]
        head = marks.elapsed(out["start"], gate.before[0])
        segments = [marks.elapsed(gate.after[i], gate.before[i + 1]) for i in range(L - 1)]
        tail = marks.elapsed(gate.after[L - 1], out["end"])
        gpu_total = marks.elapsed(out["start"], out["end"])
        gpu_wait = sum(stalls)
        io_s = gate.host_ready[L - 1] - t0
        kv_bytes = blocks * self.slot_bytes * L
        run = {"method": method, "repeat": repeat, "ttft_s": ttft, "io_s": io_s, "restore_gbps": kv_bytes / io_s / 1e9,
               "restored_bytes": kv_bytes, **moved,
               "gpu_s": gpu_total, "gpu_wait_s": gpu_wait, "gpu_busy_s": gpu_total - gpu_wait,
               "hidden_io_s": max(0.0, io_s - gpu_wait), "compute_head_s": head, "compute_layers_s": segments,
               "compute_tail_s": tail, "token": out["token"], **stats}
        run["hidden_io_share"] = run["hidden_io_s"] / io_s if io_s > 0 else 0.0
        if repeat == 0:
            run["layer_ready_s"] = [t - t0 for t in gate.host_ready]
            run["layer_wait_s"] = stalls
        if keep:
            self.logits[(repeat, prefix, method)] = out["logits"]
        del out, cache
        run["mismatched_blocks"] = self.mismatched_blocks(blocks)
        if run["mismatched_blocks"]:
            self.ctx.fail(f"{self.name} {prefix} tokens, {method}, repeat {repeat}: {run['mismatched_blocks']} "
                          "restored blocks differ from the prefill's KV")
        self.check_read_from_disk(f"{prefix} tokens, {method}, repeat {repeat}", moved, kv_bytes)
        if method == "tutti" and not (stats["verified_bytes"] == stats["bytes"] == kv_bytes):
            self.ctx.fail(f"{self.name} {prefix} tokens, tutti, repeat {repeat}: {stats['verified_bytes']} bytes "
                          f"verified, {stats['bytes']} loaded, {kv_bytes} expected")
        return run

    def run_disk_limit(self, prefix: int, repeat: int) -> dict:
        import readers

        self.ctx.drop_caches()
        counted = self.counters.read()
        r = readers.disk_limit(self.directory, self.layers, prefix // self.bt, self.slot_bytes, self.piece_bytes,
                               self.ctx.args.queue_depth)
        moved = ReadCounters.delta(counted, self.counters.read())
        self.check_read_from_disk(f"{prefix} tokens, {DISK}, repeat {repeat}", moved, r["bytes"])
        return {"method": DISK, "repeat": repeat, "seconds": r["seconds"], "gbps": r["gbps"], "bytes": r["bytes"],
                **moved}

    def check_read_from_disk(self, what: str, moved: dict, expected: int) -> None:
        """The figures are the disk's: the block device under --dir (else this process's block-layer
        reads) delivered at least the bytes restored. A page-cache hit moves neither counter."""
        for key in ("device_read_bytes", "process_read_bytes"):
            if moved[key] is not None:
                if moved[key] < expected:
                    self.ctx.fail(f"{self.name} {what}: {key.replace('_', ' ')} {moved[key]} < the {expected} bytes "
                                  "restored: part of it came from the page cache, not the disk")
                return

    def one(self, method: str, prefix: int, repeat: int, timed: bool = True) -> dict | None:
        try:
            if method == "recompute":
                return self.run_recompute(prefix, repeat, keep=timed)
            if method == DISK:
                return self.run_disk_limit(prefix, repeat)
            if method == "resident":
                return self.run_resident(prefix, repeat, keep=timed)
            return self.run_restore(method, prefix, repeat, keep=timed)
        except Exception as e:  # noqa: BLE001  (recorded as a failed check; the other methods go on)
            self.ctx.fail(clip(f"{self.name} {prefix} tokens, {method}, repeat {repeat}: {type(e).__name__}: {e}"))
            if method in self.readers:
                self.readers[method].drain()  # nothing of this run may still land in the destinations
            self.ctx.sync()
            return None

    def schedule(self) -> list[str]:
        methods = [m for m in self.ctx.args.method_list if m in ("recompute", "resident") or m in self.readers]
        if not self.ctx.args.no_disk_limit and self.slot_layout_ok:
            methods.append(DISK)
        return methods

    def warm_up(self) -> None:
        smallest = min(self.prefixes)
        t = time.perf_counter()
        for method in ("recompute", "resident"):
            if method in self.ctx.args.method_list:
                for prefix in self.prefixes:  # every shape once: kernels, cuBLAS heuristics, the allocator
                    self.one(method, prefix, -1, timed=False)
        for method in self.readers:
            self.one(method, smallest, -1, timed=False)
        # While every reader is open: the descriptors on the store's files, and which are O_DIRECT.
        fds = open_descriptors(self.directory)
        self.result["descriptors"] = fds
        self.result["read_counters"] = {"device": self.counters.device, "device_stat": self.counters.stat_path}
        buffered = sorted({d["file"] for d in fds if not d["o_direct"] and not d["writable"]})
        log(f"{self.name}: warm-up (recompute and resident at every prefix, each restore at {smallest} tokens) "
            f"{time.perf_counter() - t:.1f} s; {len(fds)} descriptors on the store's files, "
            f"{sum(d['o_direct'] for d in fds)} O_DIRECT" + (f", read-only buffered: {buffered}" if buffered else "")
            + f"; bytes read counted on {self.counters.device or 'this process (/proc/self/io)'}")

    def measure(self, deadline: float, write) -> None:
        methods = self.schedule()
        args = self.ctx.args
        for repeat in range(args.repeats):
            order = methods[repeat % len(methods):] + methods[:repeat % len(methods)]
            for prefix in self.prefixes:
                # Past this model's share no repeat after the first starts a prefix; the first repeat
                # stops only past the whole budget (so a slow disk cannot run into the device tool's limit).
                if time.perf_counter() > (deadline if repeat > 0 else self.ctx.deadline):
                    self.result["skipped"] = (f"repeat {repeat} from prefix {prefix} on and any later repeat skipped: "
                                              f"past the time budget (--time-budget-s {args.time_budget_s:g})")
                    log(f"{self.name}: {self.result['skipped']}")
                    write()
                    return
                line = []
                for method in order:
                    run = self.one(method, prefix, repeat)
                    if run is None:
                        line.append(f"{method} FAILED")
                        continue
                    self.runs[prefix].append(run)
                    if method == DISK:
                        line.append(f"{DISK} {run['gbps']:.3g} GB/s")
                    elif method in ("recompute", "resident"):
                        line.append(f"{method} {run['ttft_s'] * 1e3:.0f} ms")
                    else:
                        line.append(f"{method} {run['ttft_s'] * 1e3:.0f} ms ({run['restore_gbps']:.3g} GB/s)")
                self.check_logits(prefix, repeat)
                log(f"{self.name} repeat {repeat} prefix {prefix}: " + ", ".join(line))
                write()

    def close(self) -> None:
        for reader in self.readers.values():
            try:
                reader.close()
            except Exception as e:  # noqa: BLE001
                log(f"{self.name}: closing {reader.name}: {e}")
        self.readers = {}
        if getattr(self, "store", None) is not None:
            self.store.close()
            self.store = None
        if getattr(self, "runtime", None) is not None:
            self.runtime.shutdown(drain_timeout_s=self.ctx.args.io_timeout_s)
            self.runtime = None
        if not self.ctx.args.keep_files:
            shutil.rmtree(self.directory, ignore_errors=True)
        for attr in ("model", "ref", "kvbuf", "prefix_ids", "suffix_ids"):
            if hasattr(self, attr):
                delattr(self, attr)
        if self.ctx.cuda:
            self.torch.cuda.empty_cache()

    # -- report --------------------------------------------------------------------------------
    def summarize(self, drives: list[float], h2d_gbps: float | None) -> None:
        entries = []
        for prefix in self.prefixes:
            runs = self.runs[prefix]
            kv_bytes = prefix * self.kv_bytes_per_token
            e = {"prefix_tokens": prefix, "kv_bytes": kv_bytes,
                 "recompute_flops": self.flops(0, prefix + self.suffix),
                 "suffix_flops": self.flops(prefix, self.suffix),
                 "flops_per_kv_byte": self.flops(0, prefix) / kv_bytes, "ttft_ms": {}, "restore_gbps": {},
                 "hidden_io": {}, "logits_vs_recompute": {}, "runs": runs}
            by = {}
            for r in runs:
                by.setdefault(r["method"], []).append(r)
            for method, rs in by.items():
                if method == DISK:
                    e["disk_limit_gbps"] = summary([r["gbps"] for r in rs])
                    continue
                e["ttft_ms"][method] = summary([r["ttft_s"] * 1e3 for r in rs])
                if method in RESTORE_METHODS:
                    e["restore_gbps"][method] = summary([r["restore_gbps"] for r in rs])
                    e["hidden_io"][method] = {
                        "io_ms": summary([r["io_s"] * 1e3 for r in rs]),
                        "gpu_wait_ms": summary([r["gpu_wait_s"] * 1e3 for r in rs]),
                        "gpu_busy_ms": summary([r["gpu_busy_s"] * 1e3 for r in rs]),
                        "hidden_io_ms": summary([r["hidden_io_s"] * 1e3 for r in rs]),
                        "hidden_io_share": summary([r["hidden_io_share"] for r in rs])}
                    e["mismatched_blocks"] = e.get("mismatched_blocks", 0) + sum(r["mismatched_blocks"] for r in rs)
                    e.setdefault("bytes_moved", {})[method] = {
                        "restored": sum(r["restored_bytes"] for r in rs),
                        "device_read": sum(r["device_read_bytes"] or 0 for r in rs)
                        if all(r["device_read_bytes"] is not None for r in rs) else None,
                        "process_read": sum(r["process_read_bytes"] or 0 for r in rs)
                        if all(r["process_read_bytes"] is not None for r in rs) else None}
            if by.get("recompute"):
                gpu = statistics.median(r["gpu_s"] for r in by["recompute"])
                e["recompute_gpu_ms"] = gpu * 1e3
                e["recompute_tflops"] = e["recompute_flops"] / gpu / 1e12 if gpu > 0 else None
            for r in by.get("recompute", []):
                if "prefix_kv_max_abs_diff_vs_stored" in r:
                    e["recompute_prefix_kv_max_abs_diff_vs_stored"] = r["prefix_kv_max_abs_diff_vs_stored"]
            medians = {m: s["median"] for m, s in e["ttft_ms"].items() if s}
            e["ratios"] = {f"{a}/{b}": medians[a] / medians[b] for a in medians for b in medians if a != b}
            for method in medians:
                if method == "recompute":
                    continue
                comparisons, exact = [], []
                for (repeat, p, m), logits in self.logits.items():
                    if p != prefix or m != method:
                        continue
                    if (repeat, p, "recompute") in self.logits:
                        comparisons.append(logit_comparison(logits, self.logits[(repeat, p, "recompute")]))
                    if method != "resident" and (repeat, p, "resident") in self.logits:
                        exact.append(float((logits - self.logits[(repeat, p, "resident")]).abs().max()))
                if comparisons:
                    e["logits_vs_recompute"][method] = {
                        "max_abs_diff": max(c["max_abs_diff"] for c in comparisons),
                        "rel_l2": max(c["rel_l2"] for c in comparisons),
                        "cosine": min(c["cosine"] for c in comparisons),
                        "argmax_agrees": all(c["argmax_agrees"] for c in comparisons),
                        "rel_l2_tolerance": self.ctx.args.logit_rtol, "repeats": len(comparisons)}
                if exact:  # every restore hands the model the same bytes as the resident run: 0 exactly
                    e["logits_vs_recompute"].setdefault(method, {})["max_abs_diff_vs_resident"] = max(exact)
            e.update(self.break_even(prefix, by, medians, drives, h2d_gbps))
            entries.append(e)
        self.result["prefixes"] = entries

    def break_even(self, prefix: int, by: dict, medians: dict, drives: list[float], h2d_gbps) -> dict:
        """The layer pipeline of a restore, from this run's medians: layer l's IO takes its bytes / the
        drive's bandwidth (the disk reads layers in order); layer l's attention starts once its IO is
        done and layer l-1's compute is; compute per layer as the CUDA events measured it in the
        resident runs (no IO wait). The restore's own overhead (lookup, submit, verification that did
        not hide) is Tutti's measured TTFT minus the model at Tutti's measured restore rate (the first
        restore method measured when Tutti was not). Solves for the bandwidth at which the TTFT equals
        recompute's and projects the TTFT for each of `drives` (GB/s, capped by the measured pinned
        host-to-device rate)."""
        restore = next((m for m in RESTORE_METHODS if m in by and by[m]), None)
        if restore is None or "recompute" not in medians:
            return {}
        source = "resident" if by.get("resident") else restore  # per-layer compute without any IO wait
        rs = by[source]
        L = self.layers
        head = statistics.median(r["compute_head_s"] for r in rs)
        tail = statistics.median(r["compute_tail_s"] for r in rs)
        layers = [statistics.median(r["compute_layers_s"][i] for r in rs) for i in range(L - 1)] + [tail]
        layer_bytes = prefix * self.kv_bytes_per_token / L
        cap = (h2d_gbps or float("inf")) * 1e9

        def model(bw: float) -> float:
            io = layer_bytes / min(bw, cap)
            t, done = head, 0.0
            for i in range(L):
                done += io
                t = max(t, done) + layers[i]
            return t

        measured_ttft = statistics.median(r["ttft_s"] for r in by[restore])
        measured_bw = statistics.median(r["restore_gbps"] for r in by[restore]) * 1e9
        overhead = measured_ttft - model(measured_bw)
        recompute_s = medians["recompute"] / 1e3
        out = {"pipeline_model": {"compute_source": source, "overhead_source": restore,
                                  "compute_head_ms": head * 1e3, "compute_tail_ms": tail * 1e3,
                                  "compute_layers_median_ms": statistics.median(layers) * 1e3,
                                  "compute_total_ms": (head + sum(layers)) * 1e3, "overhead_ms": overhead * 1e3,
                                  "h2d_cap_gbps": h2d_gbps}}
        floor = overhead + model(float("inf"))
        if floor >= recompute_s:
            out["break_even_gbps"] = None
            out["break_even_note"] = "restore cannot win: the suffix's compute plus overheads exceed recompute"
        elif overhead + model(1e6) <= recompute_s:
            out["break_even_gbps"] = 1e6 / 1e9
            out["break_even_note"] = "restore wins at every bandwidth down to 1 MB/s (compute-bound shape)"
        else:
            lo, hi = 1e6, 1e15
            for _ in range(200):
                mid = math.sqrt(lo * hi)
                if overhead + model(mid) > recompute_s:
                    lo = mid
                else:
                    hi = mid
            out["break_even_gbps"] = hi / 1e9
        out["projected_ttft_ms"] = {f"{g:g}": (overhead + model(g * 1e9)) * 1e3 for g in drives}
        out["projected_recompute_over_restore"] = {f"{g:g}": recompute_s / (overhead + model(g * 1e9)) for g in drives}
        return out


def fmt_ms(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['median']:.0f} [{s['min']:.0f}-{s['max']:.0f}]"


def print_report(results: dict) -> None:
    for m in results["models"]:
        print()
        print(f"== {m['name']} with {m['layers']} layers ({m['dtype']}, {m['kv_heads']} KV heads x {m['head_dim']}, "
              f"{m['kv_bytes_per_token'] >> 10} KiB of KV per token), suffix {m['suffix_tokens']} tokens")
        for method, entry in m["methods"].items():
            print(f"   {method:9s}: " + (entry.get("detail", "") if entry["measured"] else
                                         "not measured: " + entry["not_measured"]))
        methods = [x for x in METHODS if any(x in e["ttft_ms"] for e in m["prefixes"])]
        print("   TTFT ms, median [min-max]")
        print("   prefix " + "".join(f"{x:>20s}" for x in methods) + f"{'disk QD32 GB/s':>16s}")
        for e in m["prefixes"]:
            disk = e.get("disk_limit_gbps")
            print(f"   {e['prefix_tokens']:6d} " + "".join(f"{fmt_ms(e['ttft_ms'].get(x)):>20s}" for x in methods)
                  + f"{(disk['median'] if disk else float('nan')):16.3g}")
        for e in m["prefixes"]:
            p = e["prefix_tokens"]
            parts = []
            for x in RESTORE_METHODS:
                if x in e["ttft_ms"] and "recompute" in e["ttft_ms"]:
                    parts.append(f"recompute/{x} {e['ratios'][f'recompute/{x}']:.2f}x")
            for x in RESTORE_METHODS:
                if x != "tutti" and x in e["ttft_ms"] and "tutti" in e["ttft_ms"]:
                    parts.append(f"{x}/tutti {e['ratios'][f'{x}/tutti']:.2f}x")
            print(f"   {p:6d} ratios of TTFT (> 1: the second is faster): " + ", ".join(parts))
            gb = ", ".join(f"{x} {s['median']:.3g}" for x, s in e["restore_gbps"].items() if s)
            disk = e.get("disk_limit_gbps")
            print(f"   {p:6d} restore GB/s: {gb}" + (f" | disk limit (O_DIRECT, QD32) {disk['median']:.3g}" if disk
                                                         else ""))
            h = e["hidden_io"].get("tutti")
            if h:
                print(f"   {p:6d} tutti overlap: IO {h['io_ms']['median']:.0f} ms, GPU waited "
                      f"{h['gpu_wait_ms']['median']:.0f} ms, GPU busy {h['gpu_busy_ms']['median']:.1f} ms -> "
                      f"{h['hidden_io_share']['median'] * 100:.1f}% of the IO hidden behind compute")
            lg = ", ".join(f"{x} {v['rel_l2']:.3g} / {v['max_abs_diff']:.3g} ("
                           + ("argmax agrees" if v["argmax_agrees"] else "argmax differs")
                           + (f", vs resident {v['max_abs_diff_vs_resident']:.3g}" if "max_abs_diff_vs_resident" in v
                              else "") + ")"
                           for x, v in e["logits_vs_recompute"].items() if "rel_l2" in v)
            if lg:
                print(f"   {p:6d} first token's logits vs recompute, relative L2 / max |diff| (tolerance "
                      f"{results['config']['logit_rtol']:g}): {lg}")
            moved = e.get("bytes_moved", {}).get("tutti")
            if moved:
                src = "device" if moved["device_read"] is not None else "process"
                print(f"   {p:6d} tutti bytes: {moved['restored'] / 2**30:.2f} GiB restored over the repeats, "
                      f"{(moved[src + '_read'] or 0) / 2**30:.2f} GiB read from the {src} counter")
            if "projected_ttft_ms" in e:
                be = e["break_even_gbps"]
                proj = ", ".join(f"{g} GB/s {v:.0f} ms ({e['projected_recompute_over_restore'][g]:.2f}x)"
                                 for g, v in e["projected_ttft_ms"].items())
                print(f"   {p:6d} break-even: restore wins above {be:.3g} GB/s" if be else
                      f"   {p:6d} break-even: none ({e['break_even_note']})", end="")
                print(f"; {e['flops_per_kv_byte']:.0f} FLOP per KV byte; projected restore TTFT {proj}")
        if m.get("skipped"):
            print("   " + m["skipped"])
    for note in results.get("skipped_models", []):
        print(note)
    print()
    print(f"checks: {'PASS' if results['pass'] else 'FAIL'} ({len(results['failures'])} failed)")
    for f in results["failures"]:
        print("   " + f)


def cell(s: dict | None, digits: int = 0) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def markdown(results: dict) -> str:
    """The tables of docs/benchmarks.md ("Restore or recompute on a transformer"), filled."""
    names = {"recompute": "recompute", "resident": "resident KV", "tutti": "Tutti", "cufile": "cuFile",
             "kvikio": "KvikIO",
             "pread": "pread+cudaMemcpy"}
    alts = ("cufile", "kvikio", "pread")
    rows = []
    env = results["environment"]
    rows.append(f"{env.get('gpu', env['device'])}, torch {env['torch']}, transformers {env['transformers']}, "
                f"files on {env.get('dir_filesystem', {}).get('source', '?')} "
                f"({env.get('dir_filesystem', {}).get('type', '?')}); {env['page_cache']}; pinned host-to-device "
                + (f"{results['h2d_gbps']:.1f} GB/s" if results["h2d_gbps"] else "-")
                + f"; {results['elapsed_s']:.0f} s in all.\n")
    for m in results["models"]:
        rows.append(f"{m['name']}, {m['layers']} layers: " + "; ".join(
            f"{x}: " + (v.get("detail", "") if v["measured"] else "not measured (" + v["not_measured"] + ")")
            for x, v in m["methods"].items() if x != "recompute"))
        if m.get("skipped"):
            rows.append(f"{m['name']}: {m['skipped']}")
    rows.append("")
    rows.append("Time to first token, ms, median [min-max] of the repeats; ratios of medians (> 1: Tutti faster):\n")
    rows.append("| model | prefix | KV GiB | " + " | ".join(names[x] for x in METHODS)
                + " | recompute / Tutti | " + " | ".join(f"{names[x]} / Tutti" for x in alts) + " |")
    rows.append("|---|---:|---:|" + "---:|" * (len(METHODS) + 1 + len(alts)))
    for m in results["models"]:
        for e in m["prefixes"]:
            ratio = [f"{e['ratios'][f'{x}/tutti']:.2f}x" if f"{x}/tutti" in e["ratios"] else "-"
                     for x in ("recompute",) + alts]
            rows.append(f"| {m['name']} ({m['layers']} layers) | {e['prefix_tokens']} | {e['kv_bytes'] / 2**30:.2f} | "
                        + " | ".join(cell(e["ttft_ms"].get(x)) for x in METHODS) + " | " + " | ".join(ratio) + " |")
    rows.append("")
    rows.append("Restore rate (the prefix's KV bytes / the time until its last layer was available, GB/s) against "
                "the disk's limit (O_DIRECT reads of the same byte ranges, queue depth 32, same run), and Tutti's "
                "overlap (CUDA events on the compute stream):\n")
    rows.append("| model | prefix | disk limit | Tutti | cuFile | KvikIO | pread+cudaMemcpy | Tutti / limit "
                "| Tutti IO ms | GPU waited ms | GPU busy ms | IO hidden |")
    rows.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in results["models"]:
        for e in m["prefixes"]:
            disk = e.get("disk_limit_gbps")
            tutti = e["restore_gbps"].get("tutti")
            share = f"{tutti['median'] / disk['median']:.2f}" if disk and tutti else "-"
            h = e["hidden_io"].get("tutti")
            overlap = ([cell(h["io_ms"]), cell(h["gpu_wait_ms"]), cell(h["gpu_busy_ms"], 1),
                        f"{h['hidden_io_share']['median'] * 100:.1f}%"] if h else ["-"] * 4)
            rows.append(f"| {m['name']} ({m['layers']} layers) | {e['prefix_tokens']} | {cell(disk, 2)} | "
                        + " | ".join(cell(e["restore_gbps"].get(x), 2) for x in RESTORE_METHODS)
                        + f" | {share} | " + " | ".join(overlap) + " |")
    rows.append("")
    rows.append("The first generated token against recompute's (pass: relative L2 of the difference within "
                f"{results['config']['logit_rtol']:g}; the argmax is information, random weights and bf16), every "
                "restore's logits against the resident KV's (pass: 0, bit-identical), and the restored KV (pass: "
                "0 blocks differing from the prefill's):\n")
    rows.append("| model | prefix | relative L2: resident / Tutti / cuFile / KvikIO / pread | max abs diff | "
                "argmax agrees | restore vs resident, max abs diff | recomputed prefix KV vs stored, max abs diff "
                "| restored blocks differing |")
    rows.append("|---|---:|---|---|---|---|---:|---:|")
    shown = ("resident",) + RESTORE_METHODS
    for m in results["models"]:
        for e in m["prefixes"]:
            lv = e["logits_vs_recompute"]
            rel = " / ".join(f"{lv[x]['rel_l2']:.3g}" if "rel_l2" in lv.get(x, {}) else "-" for x in shown)
            diffs = " / ".join(f"{lv[x]['max_abs_diff']:.3g}" if "max_abs_diff" in lv.get(x, {}) else "-"
                               for x in shown)
            agree = " / ".join(("yes" if lv[x]["argmax_agrees"] else "no") if "argmax_agrees" in lv.get(x, {})
                               else "-" for x in shown)
            same = " / ".join(f"{lv[x]['max_abs_diff_vs_resident']:.3g}"
                              if "max_abs_diff_vs_resident" in lv.get(x, {}) else "-" for x in RESTORE_METHODS)
            kv = e.get("recompute_prefix_kv_max_abs_diff_vs_stored")
            kv_text = "-" if kv is None else f"{kv:.3g}"
            rows.append(f"| {m['name']} ({m['layers']} layers) | {e['prefix_tokens']} | {rel} | {diffs} | {agree} | "
                        f"{same} | {kv_text} | {e.get('mismatched_blocks', '-')} |")
    rows.append("")
    drives = results["config"]["drive_gbps"]
    rows.append("Break-even: recompute's cost per KV byte, the drive bandwidth above which the overlapped restore "
                "beats recompute (layer pipeline with this run's per-layer compute), and the projected Tutti "
                "TTFT (recompute / projected in parentheses):\n")
    rows.append("| model | prefix | FLOP per KV byte | recompute TFLOP/s | break-even GB/s | disk limit GB/s | "
                + " | ".join(f"{g:g} GB/s" for g in drives) + " |")
    rows.append("|---|---:|---:|---:|---:|---:|" + "---:|" * len(drives))
    for m in results["models"]:
        for e in m["prefixes"]:
            disk = e.get("disk_limit_gbps")
            be = e.get("break_even_gbps")
            proj = []
            for g in drives:
                key = f"{g:g}"
                if "projected_ttft_ms" in e:
                    ms, ratio = e["projected_ttft_ms"][key], e["projected_recompute_over_restore"][key]
                    proj.append(f"{ms:.0f} ms ({ratio:.2f}x)")
                else:
                    proj.append("-")
            tf = e.get("recompute_tflops")
            tf_text = "-" if tf is None else f"{tf:.0f}"
            be_text = "-" if be is None else f"{be:.3g}"
            disk_text = "-" if not disk else f"{disk['median']:.2f}"
            rows.append(f"| {m['name']} ({m['layers']} layers) | {e['prefix_tokens']} | {e['flops_per_kv_byte']:.0f} | "
                        f"{tf_text} | {be_text} | {disk_text} | " + " | ".join(proj) + " |")
    return "\n".join(rows) + "\n"


def plot(results: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    models = [m for m in results["models"] if m["prefixes"]]
    if not models:
        return "nothing measured: no plot"
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    styles = {"recompute": ("black", "o"), "resident": ("tab:olive", "x"), "tutti": ("tab:red", "s"),
              "cufile": ("tab:blue", "^"),
              "kvikio": ("tab:green", "v"), "pread": ("tab:gray", "D")}
    for ax, m in zip(axes[0], models):
        xs = [e["prefix_tokens"] for e in m["prefixes"]]
        for method, (color, marker) in styles.items():
            pts = [(e["prefix_tokens"], e["ttft_ms"][method]) for e in m["prefixes"] if e["ttft_ms"].get(method)]
            if not pts:
                continue
            x = [p for p, _ in pts]
            med = [s["median"] for _, s in pts]
            err = [[s["median"] - s["min"] for _, s in pts], [s["max"] - s["median"] for _, s in pts]]
            ax.errorbar(x, med, yerr=err, color=color, marker=marker, capsize=3, label=method)
        for g, dash in zip(results["config"]["drive_gbps"], ("--", ":", "-.")):
            pts = [(e["prefix_tokens"], e["projected_ttft_ms"][f"{g:g}"]) for e in m["prefixes"]
                   if "projected_ttft_ms" in e]
            if pts:
                ax.plot([p for p, _ in pts], [v for _, v in pts], dash, color="tab:red", alpha=0.6,
                        label=f"tutti projected, {g:g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 else str(x) for x in xs])
        ax.set_xlabel(f"prefix tokens (+{m['suffix_tokens']} new)")
        ax.set_ylabel("time to first token, ms (median, min-max)")
        ax.set_title(f"{m['name']}, {m['layers']} layers, {m['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    env = results["environment"]
    fig.suptitle(f"Restore vs recompute on {env.get('gpu', env['device'])}; disk: "
                 f"{env.get('dir_filesystem', {}).get('source', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def report_from(path: str, out: str) -> int:
    """Renders OUT/ttft.md and OUT/ttft.png (and the console report) from a ttft.json written by an
    earlier run, e.g. on a machine with matplotlib after a GPU run on one without."""
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print(f"ttft: --report-from {path}: {e}", file=sys.stderr)
        return 2
    if results.get("schema") != "tutti-ttft/1":
        print(f"ttft: --report-from {path}: not a ttft.json (schema {results.get('schema')!r})", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ttft.md"), "w") as f:
        f.write(markdown(results))
    message = plot(results, os.path.join(out, "ttft.png"))
    print(message or f"plot: {os.path.join(out, 'ttft.png')}")
    print_report(results)
    return 0 if results["pass"] else 1


def main(argv: list[str]) -> int:
    global LOG_FILE
    if argv[:1] == ["--report-from"]:
        if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--out"):
            print("ttft: usage: ttft.py --report-from OUT/ttft.json [--out DIR]", file=sys.stderr)
            return 2
        return report_from(argv[1], argv[3] if len(argv) == 4 else os.path.dirname(os.path.abspath(argv[1])))
    try:
        args = parse_args(argv)
        models = load_shapes(args)
    except BadOption as e:
        print(f"ttft: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    LOG_FILE = open(os.path.join(args.out, "ttft.log"), "w")
    sys.path.insert(0, HERE)
    try:
        ctx = Context(args)
    except BadOption as e:
        print(f"ttft: {e}", file=sys.stderr)
        return 2
    torch = ctx.torch
    torch.set_grad_enabled(False)
    results = {"schema": "tutti-ttft/1", "command": ["bench/model/ttft.py"] + argv,
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "environment": environment(ctx),
               "config": {"models": args.models, "prefixes": args.prefix_list, "suffix_tokens": args.suffix,
                          "block_tokens": args.block_tokens, "repeats": args.repeats, "methods": args.method_list,
                          "queue_depth": args.queue_depth, "pread_threads": args.pread_threads,
                          "drive_gbps": args.drive_list, "time_budget_s": args.time_budget_s, "seed": args.seed,
                          "quick": args.quick, "logit_rtol": args.logit_rtol,
                          "dir": args.dir},
               "models": [], "pass": False, "failures": ctx.failures}
    log(f"ttft: {results['environment'].get('gpu', 'CPU')}, torch {torch.__version__}, transformers "
        f"{results['environment']['transformers']}, tutti {ctx.tutti.build_info()['accelerator']} build; "
        f"{ctx.drop_note}; output in {args.out}")
    results["h2d_gbps"] = measure_h2d(ctx)
    if results["h2d_gbps"]:
        log(f"pinned host-to-device copies: {results['h2d_gbps']:.1f} GB/s")
    json_path = os.path.join(args.out, "ttft.json")
    runs: list[ModelRun] = []

    def write() -> None:
        for r in runs:
            r.summarize(args.drive_list, results["h2d_gbps"])
        results["models"] = [r.result for r in runs]
        results["pass"] = not ctx.failures and any(e["runs"] for r in runs for e in r.result["prefixes"])
        results["elapsed_s"] = time.perf_counter() - T0
        results["environment"]["page_cache"] = ctx.drop_note
        with open(json_path + ".tmp", "w") as f:
            json.dump(results, f, indent=1, default=float)
        os.replace(json_path + ".tmp", json_path)

    for index, (name, layers, shape, dtype_entry) in enumerate(models):
        if time.perf_counter() > ctx.deadline:
            note = f"{name} with {layers} layers not run: past the time budget (--time-budget-s {args.time_budget_s:g})"
            results.setdefault("skipped_models", []).append(note)
            log(note)
            continue
        run = ModelRun(ctx, name, layers, shape, dtype_entry)
        runs.append(run)
        # The budget left, shared by this model and the later ones in proportion to their KV bytes
        # per token (what the restores and the disk-limit reads move).
        weights = [m[1] * m[2]["kv_heads"] * m[2]["head_dim"] * m[3]["bytes"] for m in models[index:]]
        remaining = ctx.deadline - time.perf_counter()
        deadline = time.perf_counter() + remaining * weights[0] / sum(weights)
        try:
            run.check_memory()
            run.build()
            run.prefill_and_store()
            run.prepare_readers()
            run.warm_up()
            run.measure(deadline, write)
        except Exception as e:  # noqa: BLE001  (reported; the next model still runs)
            ctx.fail(clip(f"{name} with {layers} layers: {type(e).__name__}: {e}"))
        finally:
            run.close()
        write()
    write()
    with open(os.path.join(args.out, "ttft.md"), "w") as f:
        f.write(markdown(results))
    message = plot(results, os.path.join(args.out, "ttft.png"))
    log(message or f"plot: {os.path.join(args.out, 'ttft.png')}")
    print_report(results)
    log(f"JSON: {json_path}; {time.perf_counter() - T0:.0f} s in all")
    return 0 if results["pass"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
