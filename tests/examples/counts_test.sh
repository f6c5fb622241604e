#!/usr/bin/env bash
# counts_test.sh EXAMPLE: counts in the summary take their noun in the singular for one ("1 layer", not
# "1 layers"): a run of one layer (uring, the tensor size given directly) names 1 layer in its model and pipeline
# lines and 1 layer file in its data line, and still counts 2 requests and 2 threads in the plural.
set -euo pipefail
example=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
"$example" --backend uring --layers 1 --context-tokens 512 --tokens-per-block 256 --hit-percent 50 \
  --tensor-bytes 65536 --compute-ms 0.1 --data-dir "$dir/data" --no-drop-caches --repeat 1 >"$dir/out.txt" 2>&1 ||
  rc=$?
[ "$rc" -eq 0 ] || { cat "$dir/out.txt"; echo "FAIL: the example exited $rc"; exit 1; }
expect() {
  grep -qE -- "$1" "$dir/out.txt" || { cat "$dir/out.txt"; echo "FAIL: no line matching '$1'"; exit 1; }
}
expect '^  model          : 1 layer; tensor size given directly \(--tensor-bytes\)$'
expect '^  shape          : 512-token prefix in 2 chunks of 256 tokens, 50% cached \(1 chunk\); '
expect "^  data           : 256 KiB in 1 layer file of 256 KiB in '$dir/data' "
expect "^writing the data set: 1 layer file of 256 KiB \(256 KiB\) in '$dir/data'\$"
expect '^  restore only   : .* \(2 requests, 2 device commands; up to 2 requests in flight\)$'
expect '^  pread 2 thr +: .* \(O_DIRECT, 2 threads: the requests Tutti kept in flight\)'
expect '^  pipeline       : [0-9.]+ ms for 1 layer: '
expect '^  verify         : 10 tensors checked \('
if grep -E '(^|[^0-9.])1 [a-zA-Z/ -]*(layers|tensors|requests|threads|chunks|files|commands|queues)\b' "$dir/out.txt"; then
  echo "FAIL: a count of 1 with a plural noun"
  exit 1
fi
echo "counts of one read in the singular"
