#!/usr/bin/env bash
# data_dir_lock_test.sh EXAMPLE: two runs must not share a data folder (each rewrites the same layer
# files, and one's written-tensor check would read the other's bytes). While another process holds the
# folder's lock (flock(1) on <data-dir>/layerwise.lock), the example fails at once with exit code 2, a
# message naming the folder and --data-dir, and no layer file written; once the lock is free it runs.
set -euo pipefail
example=$1
command -v flock >/dev/null || { echo "SKIP: flock(1) (util-linux) not installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
data="$dir/data"
mkdir -p "$data"
args=(--backend uring --layers 2 --context-tokens 512 --tokens-per-block 256 --tensor-bytes 65536 --compute-ms 0.1
      --data-dir "$data" --no-drop-caches --no-pread-baseline --repeat 1)
# flock holds the lock on its own open file description for as long as the example runs under it.
set +e
start=$(date +%s%N)
flock --exclusive --nonblock "$data/layerwise.lock" timeout 20 "$example" "${args[@]}" >"$dir/out.txt" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
set -e
cat "$dir/out.txt"
[ "$rc" -eq 2 ] || { echo "FAIL: with the lock held the example exited $rc, expected 2"; exit 1; }
grep -qF "data directory '$data' is in use by another layerwise_kv_overlap run" "$dir/out.txt" ||
  { echo "FAIL: the message does not name the folder"; exit 1; }
grep -qF -- "--data-dir" "$dir/out.txt" || { echo "FAIL: the message does not name --data-dir"; exit 1; }
[ "$elapsed_ms" -lt 10000 ] || { echo "FAIL: took $elapsed_ms ms to fail: it waited for the lock"; exit 1; }
if ls "$data"/layer-*.kv >/dev/null 2>&1; then echo "FAIL: layer files written without the lock"; exit 1; fi
echo "refused at once while the folder is locked ($elapsed_ms ms)"
# The lock is released with the process: the same folder is usable by the next run, twice in a row.
for run in 1 2; do
  rc=0
  timeout 120 "$example" "${args[@]}" >"$dir/out.txt" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { cat "$dir/out.txt"; echo "FAIL: run $run exited $rc"; exit 1; }
  grep -q "0 mismatched -> VERIFIED" "$dir/out.txt" || { cat "$dir/out.txt"; echo "FAIL: run $run not verified"; exit 1; }
done
echo "ran twice after the lock was released"
