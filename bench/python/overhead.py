"""The Python package's cost per call: submit + wait of a batch of B requests from Python
(rt.submit(requests).wait(...)) against the same batch in a C++ loop in the same process, on the same
runtime, target and memory (Runtime._bench_submit_wait: StorageRuntime submit + wait + release, GIL
released), in the same run. Rounds alternate Python and C++ so drift hits both; the median round counts.

    python bench/python/overhead.py                        # memfs and uring, batches 1, 24, 256 of 4 KiB
    python bench/python/overhead.py --device cuda --backends uring --batches 24 --request-bytes 524288
                                                           # the GPU half: 24 x 512 KiB into CUDA tensors

Reported per batch: the mean wall time of one submit + wait in Python and in C++ (us), GB/s of both
and their ratio (C++ time / Python time: Python's share of C++'s throughput), and the mean CPU time
of the calling thread for both (time.thread_time_ns; the C++ loop runs on the same thread): their
difference is the Python overhead per call and per request. On a loaded machine the CPU-time
difference is the steady figure; wall times move with the load. The bytes read are verified against the file (or the
memfs target) after the timed loops; a mismatch exits 1. Needs the installed package (pip install .)
and, for uring, a folder on a file system with O_DIRECT (--dir, default /var/tmp).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import tutti


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="memfs,uring", help="comma separated: memfs, uring")
    p.add_argument("--batches", default="1,24,256", help="requests per submit, comma separated")
    p.add_argument("--request-bytes", type=int, default=4096, help="bytes per request (multiple of 4096)")
    p.add_argument("--iterations", type=int, default=0,
                   help="submit+wait calls per round (0: about 64 MiB or 2000 calls per round, whichever is fewer)")
    p.add_argument("--rounds", type=int, default=7, help="rounds of each (Python and C++), alternating")
    p.add_argument("--device", default="cpu", help="where the memory is: cpu, or cuda (CUDA build, uring)")
    p.add_argument("--dir", default="/var/tmp", help="folder for the uring file (O_DIRECT)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def main():
    args = parse()
    if args.request_bytes <= 0 or args.request_bytes % 4096:
        sys.exit(f"--request-bytes = {args.request_bytes} must be a positive multiple of 4096")
    batches = [int(b) for b in args.batches.split(",")]
    if any(b < 1 or b > 8192 for b in batches):
        sys.exit(f"--batches = {args.batches}: each must be in 1..8192")
    import torch

    rows = []
    work = tempfile.mkdtemp(prefix="tutti-bench-py-", dir=args.dir)
    for backend in args.backends.split(","):
        span = max(batches) * args.request_bytes
        payload = os.urandom(span)
        options = {"queue_depth": max(256, max(batches))} if backend == "uring" else {}
        with tutti.Runtime(backend, **options) as rt:
            if backend == "uring":
                path = os.path.join(work, "data.bin")
                with open(path, "wb") as f:
                    f.write(payload)
                    os.fsync(f.fileno())
                target = rt.open("file://" + path)
            else:
                target = rt.open(f"memfs://data?size={span}", writable=True)
                staging = tutti.empty(span, torch.uint8)
                staging.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
                m = rt.register(staging)
                rt.submit([(tutti.WRITE, m, 0, target, 0, span)]).wait(timeout_s=30)
                m.unregister()
            buffer = tutti.empty(span, torch.uint8, device=args.device)
            memory = rt.register(buffer)
            for batch in batches:
                requests = [(tutti.READ, memory, i * args.request_bytes, target, i * args.request_bytes,
                             args.request_bytes) for i in range(batch)]
                bytes_per_call = batch * args.request_bytes
                iterations = args.iterations or max(20, min(2000, (64 << 20) // bytes_per_call))
                for _ in range(3):  # warm-up of both paths
                    rt.submit(requests).wait(timeout_s=30)
                rt._bench_submit_wait(requests, 3)
                py, cpp, py_cpu, cpp_cpu = [], [], [], []
                for _ in range(args.rounds):
                    start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
                    for _ in range(iterations):
                        rt.submit(requests).wait(timeout_s=30)
                    py_cpu.append((time.thread_time_ns() - start_cpu) / iterations)
                    py.append((time.perf_counter_ns() - start) / iterations)
                    start_cpu = time.thread_time_ns()  # the C++ loop runs on this same thread
                    cpp.append(rt._bench_submit_wait(requests, iterations))
                    cpp_cpu.append((time.thread_time_ns() - start_cpu) / iterations)
                buffer.zero_()
                rt.submit(requests).wait(timeout_s=30)  # the bytes the loops counted are the file's
                expected = torch.frombuffer(bytearray(payload[:bytes_per_call]), dtype=torch.uint8)
                if not torch.equal(buffer[:bytes_per_call].cpu(), expected):
                    sys.exit(f"{backend} batch {batch}: the bytes read differ from the source")
                py_ns, cpp_ns = statistics.median(py), statistics.median(cpp)
                py_cpu_ns, cpp_cpu_ns = statistics.median(py_cpu), statistics.median(cpp_cpu)
                rows.append({
                    "backend": backend, "device": args.device, "batch": batch, "request_bytes": args.request_bytes,
                    "iterations": iterations, "rounds": args.rounds,
                    "python_us": py_ns / 1e3, "cpp_us": cpp_ns / 1e3,
                    "overhead_us": (py_ns - cpp_ns) / 1e3, "overhead_per_request_us": (py_ns - cpp_ns) / 1e3 / batch,
                    "python_gbps": bytes_per_call / py_ns, "cpp_gbps": bytes_per_call / cpp_ns,
                    "ratio": cpp_ns / py_ns,
                    "python_cpu_us": py_cpu_ns / 1e3, "cpp_cpu_us": cpp_cpu_ns / 1e3,
                    "overhead_cpu_us": (py_cpu_ns - cpp_cpu_ns) / 1e3,
                    "overhead_cpu_per_request_us": (py_cpu_ns - cpp_cpu_ns) / 1e3 / batch,
                })
                r = rows[-1]
                print(f"{backend:6} {args.device:5} batch {batch:4} x {args.request_bytes:7} B: wall python "
                      f"{r['python_us']:9.2f} us C++ {r['cpp_us']:9.2f} us (ratio {r['ratio']:.3f}, "
                      f"{r['python_gbps']:.2f} vs {r['cpp_gbps']:.2f} GB/s); thread CPU python "
                      f"{r['python_cpu_us']:8.2f} us C++ {r['cpp_cpu_us']:8.2f} us: overhead "
                      f"{r['overhead_cpu_us']:7.2f} us per call, "
                      f"{r['overhead_cpu_per_request_us']:6.3f} us per request",
                      flush=True)
            memory.unregister()
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    os.rmdir(work)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"build": tutti.build_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
