#!/usr/bin/env bash
# example_test.sh EXAMPLE BACKEND: runs the layer-wise example on a small shape in a fresh data
# directory and checks that it verifies; then corrupts one cached tensor on disk (file backends) and
# checks that the example fails with exit code 1 and names the mismatch.
set -euo pipefail
example=$1 backend=$2
if [ "$backend" = nvme-soft ] && [ "$(id -u)" -ne 0 ]; then echo "SKIP: nvme-soft needs root"; exit 77; fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--backend "$backend" --layers 6 --context-tokens 1024 --chunk-tokens 256 --tensor-bytes 65536
      --compute-ms 0.5 --data-dir "$dir/data" --json "$dir/report.json" --no-drop-caches)
"$example" "${args[@]}" >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; echo "FAIL: example exited $?"; exit 1; }
grep -q "0 mismatched -> VERIFIED" "$dir/out.txt" || { cat "$dir/out.txt"; echo "FAIL: no VERIFIED line"; exit 1; }
python3 - "$dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
# 6 layers x 3 cached chunks x 2 tensors, read in the restore and pipeline phases, + written tensors read back.
assert r["restore_only"]["requests"] == 36, r
assert r["pipeline_reads"]["requests"] == 36, r
assert r["pipeline_writes"]["requests"] == 12, r
assert r["restore_only"]["bytes"] == 36 * 65536, r
assert r["mismatched_tensors"] == 0 and r["verified_tensors"] >= 36 * 2 + 12, r
PY
echo "clean run verified"
[ "$backend" = uring ] || exit 0  # the corruption check edits plain files in the data directory

# Corrupt one byte of layer 2, chunk 1, V tensor: (2*1+1) * 65536 + 100.
printf '\xff' | dd of="$dir/data/layer-002.kv" bs=1 seek=$((3 * 65536 + 100)) conv=notrunc status=none
printf '\x00' | dd of="$dir/data/layer-002.kv" bs=1 seek=$((3 * 65536 + 101)) conv=notrunc status=none
sync
set +e
"$example" "${args[@]}" --no-pread-baseline >"$dir/out2.txt" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ]; then cat "$dir/out2.txt"; echo "FAIL: corrupted data gave exit code $rc, expected 1"; exit 1; fi
grep -q "layer 2 chunk 1 V" "$dir/out2.txt" || { cat "$dir/out2.txt"; echo "FAIL: mismatch not named"; exit 1; }
echo "corruption detected"
