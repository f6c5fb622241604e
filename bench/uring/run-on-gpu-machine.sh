#!/usr/bin/env bash
# Builds the cuda profile's uring GPU suite and gpu_kv_read on a GPU machine (dependencies missing
# there come from the .deb folder, unpacked into a private prefix as in
# tests/gpu/run-on-gpu-machine.sh), runs the suite, then the benchmark with the figures' settings.
#
#   bench/uring/run-on-gpu-machine.sh OUT_DIR [gpu_kv_read flags...]
#
# OUT_DIR receives env.txt (GPU, driver, CUDA, cuFile, file system), test.log, bench.log and
# gpu_kv_read.json. Exit status: the suite's, else the benchmark's.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: run-on-gpu-machine.sh OUT_DIR [gpu_kv_read flags...]}
shift
mkdir -p "$out"
. scripts/gpu-machine-env.sh .deb
tutti_provide_udev_record /var/tmp
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  ls /usr/local/cuda/lib64/libcufile.so* 2>&1 | head -2
  echo "nvidia-fs: $(cat /proc/driver/nvidia-fs/version 2>/dev/null || echo 'not loaded')"
  echo "drop_caches writable: $([ -w /proc/sys/vm/drop_caches ] && echo yes || echo no)"
  df -T /var/tmp | tail -1
  uname -r
  nproc
  grep -n 'compat_mode\|"use_poll_mode"' /etc/cufile.json
} > "$out/env.txt" 2>&1
build=build-u-cuda
[ -f "$build/build.ninja" ] || meson setup "$build" -Daccelerator=cuda -Dwerror=true -Dbench=true -Dexamples=false \
  > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
ninja -C "$build" -j16 tests/uring/test_uring_gpu bench/uring/gpu_kv_read > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
timeout 60 "$build/tests/uring/test_uring_gpu" > "$out/test.log" 2>&1
status=$?
tail -4 "$out/test.log"
timeout 120 "$build/bench/uring/gpu_kv_read" --json "$out/gpu_kv_read.json" "$@" > "$out/bench.log" 2>&1
bench_status=$?
cat "$out/bench.log"
[ -f cufile.log ] && tail -c 20000 cufile.log > "$out/cufile.log"  # cuFile's own log (cwd), when it wrote one
[ "$status" -ne 0 ] || status=$bench_status
exit "$status"
