#!/usr/bin/env bash
# gpu_kv_read_options_test.sh BENCH: gpu_kv_read (cuda profile) refuses nonsense flags with exit code 2
# and a message naming the flag, before it writes a file or touches the GPU (so no GPU is needed).
set -euo pipefail
bench=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
# expect_refused WORD ARGS...: exit 2 within 10 s, WORD in the message, nothing written.
expect_refused() {
  local word=$1
  shift
  set +e
  timeout 10 "$bench" --dir "$dir/kv" "$@" >"$dir/out.txt" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne 2 ] || ! grep -q -- "$word" "$dir/out.txt" || [ -e "$dir/kv" ]; then
    echo "FAIL: $* -> exit $rc (want 2, message with '$word', no files):"
    cat "$dir/out.txt"
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit 2"
  fi
}
# strtoull takes "-4096" as 2^64 - 4096, a multiple of 4096: the working set wrapped.
expect_refused "--tensor-bytes" --tensor-bytes -4096
# The cast to 32 bits turned 2^32 + 2 into 2, which passed the 2..32768 check.
expect_refused "--queue-depth" --queue-depth 4294967298
expect_refused "--cufile-threads" --cufile-threads 4294967312
expect_refused "--layers" --layers 1001
expect_refused "1 TiB" --layers 2 --tensors-per-layer 1048576 --tensor-bytes 1073741824
expect_refused "--block-bytes" --block-bytes 6144
# Only decimal digits: CLI11 alone reads "010" as 8; NaN once passed a floating-point range check.
expect_refused "--queue-depth" --queue-depth 010
expect_refused "--pass-seconds" --pass-seconds nan
[ "$failures" -eq 0 ] || { echo "FAIL: $failures case(s)"; exit 1; }
echo "all nonsense refused"
