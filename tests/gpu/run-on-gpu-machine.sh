#!/usr/bin/env bash
# Builds the cuda profile and runs the GPU suite (accel, queue, soft controller, local_nvme) and
# the GPU benchmarks (submission rate, end-to-end local_nvme reads) on a machine
# with an NVIDIA GPU, nvcc, meson and ninja, also one without network: build dependencies that
# are missing there (liburing, uriparser, fmt, ...) come as Debian .deb files that this script
# unpacks into a private prefix (never into /) and points pkg-config, CMake and the loader at.
#
#   tests/gpu/run-on-gpu-machine.sh [--debs DIR] [--build DIR] [--out DIR] [--no-bench]
#
#   --debs DIR   folder of .deb files to unpack when pkg-config lacks liburing (default: .deb)
#   --build DIR  meson build folder (default: build-cuda)
#   --out DIR    where logs and the benchmark's JSON go (default: the build folder)
# Exit status: that of the test run, else of the benchmark. See docs/gpu.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
debs=.deb build=build-cuda out="" bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) debs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$build
mkdir -p "$out"
. scripts/gpu-machine-env.sh "$debs"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -2

# The whole cuda profile (tests, benchmarks, examples): the gpu suite spans several areas
# (tests/gpu, tests/uring's DEVICE-memory test, ...).
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Daccelerator=cuda -Dwerror=true 2>&1 | tee "$out/setup.log" | tail -15 || exit 1
fi
ninja -C "$build" 2>&1 | tee "$out/build.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

meson test -C "$build" --no-rebuild --print-errorlogs --suite gpu 2>&1 | tee "$out/test.log"
status=${PIPESTATUS[0]}
cp "$build/meson-logs/testlog.txt" "$out/testlog.txt" 2>/dev/null || true

if [ "$bench" = 1 ]; then
  "$build/bench/gpu/tutti-bench-gpu-submit" --json "$out/gpu_submit_rate.json" 2>&1 | tee "$out/bench.log"
  bench_status=${PIPESTATUS[0]}
  [ "$status" -ne 0 ] || status=$bench_status
  if [ -x "$build/tests/gpu/tutti-bench-gpu-local-nvme" ]; then
    "$build/tests/gpu/tutti-bench-gpu-local-nvme" --json "$out/gpu_local_nvme_read.json" 2>&1 | tee -a "$out/bench.log"
    bench_status=${PIPESTATUS[0]}
    [ "$status" -ne 0 ] || status=$bench_status
  fi
fi
exit "$status"
