#!/usr/bin/env bash
# The figures of docs/benchmarks.md "The main job on the GPU" and "tutti-bench sweep", in one go on a
# machine with an NVIDIA GPU, nvcc, meson and ninja (also one without network: missing build
# dependencies come as Debian .deb files, unpacked as tests/gpu/run-on-gpu-machine.sh does):
#
#   bench/tool/gpu-figures.sh [--out DIR] [--build DIR] [--data DIR] [--seconds S] [--no-sweep]
#
#   --out DIR      where results go (default: gpu-figures)
#   --build DIR    meson build folder, cuda profile, release (default: build-figures)
#   --data DIR     data directory on the file system to measure (default: /var/tmp/tutti-figures)
#   --seconds S    duration of each tutti-bench point (default: 1)
#   --no-sweep     only the example
#   --also ARGS    run the example a second time with these extra arguments (e.g. "--compute-ms 8"),
#                  into DIR/layerwise-gpu-2.{txt,json}
#
# Writes DIR/machine.txt, DIR/log.txt (build log, progress), DIR/layerwise-gpu.{txt,json} (the CUDA example, 80 layers, defaults, uring
# backend, KV slots in GPU memory, with the pread + cudaMemcpy and cuFile baselines of the same run),
# DIR/sweep.{txt,json} (tutti-bench, uring backend, host memory, 4 KiB .. 1 MiB, seq and rand reads,
# queue depths 8 and 64) and the PNGs of scripts/plot-bench. Exit status: the example's, else the sweep's.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=gpu-figures build=build-figures data=/var/tmp/tutti-figures seconds=1 sweep=1 debs=.deb also=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --no-sweep) sweep=0; shift ;;
    --also) also=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" "$data"
. scripts/gpu-machine-env.sh "$debs"
tutti_provide_udev_record "$data"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  echo "cpus: $(nproc), kernel: $(uname -r)"
  df -hT "$data" | tail -1
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Daccelerator=cuda --buildtype=release -Dtests=false >"$out/log.txt" 2>&1 ||
    { tail -30 "$out/log.txt"; exit 1; }
fi
ninja -C "$build" examples/layerwise_kv_overlap bench/tool/tutti-bench >>"$out/log.txt" 2>&1 ||
  { grep -B2 -A12 -m3 'error' "$out/log.txt"; tail -20 "$out/log.txt"; exit 1; }
grep -A3 'CUDA libraries' "$build/meson-logs/meson-log.txt" | tail -3 >>"$out/machine.txt"
echo "built in ${SECONDS}s"

# cuFile reads its settings from the environment (CUFILE_ENV_PATH_JSON, CUFILE_FORCE_COMPAT_MODE): they
# pass through. Without the nvidia-fs module it runs in compat mode (POSIX reads into its own bounce
# buffers + copies), which bench/support/cufile_reader.hpp allows and the summary reports.
"$build/examples/layerwise_kv_overlap" --data-dir "$data/layerwise" --json "$out/layerwise-gpu.json" \
  >"$out/layerwise-gpu.txt" 2>>"$out/log.txt"
status=$?
cat "$out/layerwise-gpu.txt"
tail -c 600 "$out/log.txt"
if [ -n "$also" ]; then
  # shellcheck disable=SC2086  # ARGS are words
  "$build/examples/layerwise_kv_overlap" --data-dir "$data/layerwise" --json "$out/layerwise-gpu-2.json" $also \
    >"$out/layerwise-gpu-2.txt" 2>>"$out/log.txt"
  second=$?
  cat "$out/layerwise-gpu-2.txt"
  [ "$status" -ne 0 ] || status=$second
fi
rm -rf "$data/layerwise"
echo "example done at ${SECONDS}s (exit status $status)"

if [ "$sweep" = 1 ]; then
  runs=()
  first=1
  for pattern in seq rand; do
    for qd in 8 64; do
      for bs in 4096 8192 16384 32768 65536 131072 262144 524288 1048576; do
        batch=$((qd < 16 ? qd : 16))
        json="$out/sweep-$pattern-qd$qd-$bs.json"
        "$build/bench/tool/tutti-bench" --backend uring --dir "$data/bench" --pattern "$pattern" --rw read \
          --block-size "$bs" --queue-depth "$qd" --batch "$batch" --files 4 --file-size $((1 << 30)) \
          --seconds "$seconds" --memory host --json "$json" 2>>"$out/log.txt" | tail -$((first + 1)) | tee -a "$out/sweep.txt"
        first=0
        runs+=("$json")
      done
    done
  done
  python3 scripts/plot-bench "$out" "${runs[@]}" || { [ "$status" -ne 0 ] || status=1; }
  python3 -c 'import json,sys; print(json.dumps([json.load(open(p)) for p in sys.argv[1:]], indent=1))' "${runs[@]}" \
    >"$out/sweep.json"
  rm -f "${runs[@]}"
  echo "sweep done at ${SECONDS}s"
  rm -rf "$data/bench"
fi
exit "$status"
