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
export PATH=/usr/local/cuda/bin:$PATH

if ! pkg-config --exists liburing liburiparser fmt nlohmann_json 2>/dev/null && [ -d "$debs" ]; then
  prefix=/tmp/tutti-deps
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
  # Debian's .pc files name /usr: point them into the prefix.
  find "$prefix" -name '*.pc' -exec sed -i "s|=/usr|=$prefix/usr|g" {} +
  export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # No pkg-config on the machine: use the carried pkgconf (meson reads $PKG_CONFIG).
  if ! command -v pkg-config >/dev/null && [ -x "$prefix/usr/bin/pkgconf" ]; then export PKG_CONFIG=$prefix/usr/bin/pkgconf; fi
  echo "dependencies from $debs unpacked into $prefix"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -2

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Daccelerator=cuda -Dbench=false -Dexamples=false -Ddaemon=false \
    2>&1 | tee "$out/setup.log" | tail -15 || exit 1
fi
targets="tests/gpu/test_gpu_accel tests/gpu/test_gpu_queue tests/gpu/tutti-bench-gpu-submit"
tests="gpu_accel gpu_queue"
# libnvm-based GPU tests and the end-to-end local_nvme benchmark, when libnvm is part of the build.
for t in soft_controller local_nvme; do
  if ninja -C "$build" -t targets all 2>/dev/null | grep -q "^tests/gpu/test_gpu_$t:"; then
    targets="$targets tests/gpu/test_gpu_$t"
    tests="$tests gpu_$t"
  fi
done
if ninja -C "$build" -t targets all 2>/dev/null | grep -q "^tests/gpu/tutti-bench-gpu-local-nvme:"; then
  targets="$targets tests/gpu/tutti-bench-gpu-local-nvme"
fi
ninja -C "$build" $targets 2>&1 | tee "$out/build.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

# By name: other areas' tests in the gpu suite (e.g. uring's) are not built here.
meson test -C "$build" --no-rebuild --print-errorlogs $tests 2>&1 | tee "$out/test.log"
status=${PIPESTATUS[0]}
cp "$build/meson-logs/testlog.txt" "$out/testlog.txt" 2>/dev/null || true

if [ "$bench" = 1 ]; then
  "$build/tests/gpu/tutti-bench-gpu-submit" --json "$out/gpu_submit_rate.json" 2>&1 | tee "$out/bench.log"
  bench_status=${PIPESTATUS[0]}
  [ "$status" -ne 0 ] || status=$bench_status
  if [ -x "$build/tests/gpu/tutti-bench-gpu-local-nvme" ]; then
    "$build/tests/gpu/tutti-bench-gpu-local-nvme" --json "$out/gpu_local_nvme_read.json" 2>&1 | tee -a "$out/bench.log"
    bench_status=${PIPESTATUS[0]}
    [ "$status" -ne 0 ] || status=$bench_status
  fi
fi
exit "$status"
