#!/usr/bin/env bash
# tutti_bench_verify_test.sh TUTTI_BENCH: tutti-bench --verify counts only checked bytes and fails on a
# wrong one. A clean uring read run and a memfs mixed run exit 0 and report checked bytes with 0
# mismatched blocks; after one 4096-byte block of a file is overwritten with zeros, a sequential read
# run over it prints VERIFY FAILED and exits 1.
set -euo pipefail
bench=$1
dir=$(mktemp -d /var/tmp/tutti-bench-verify-XXXXXX)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/verify_run.sh"  # run EXPECTED_EXIT PATTERN ARGS...
common=(--files 1 --file-size 4194304 --block-size 4096 --queue-depth 16 --batch 4 --seconds 0.3 --no-drop-caches)
run 0 "verify: [1-9][0-9]* bytes read and checked, 0 bytes written and read back, 0 mismatched" \
  --backend uring --dir "$dir/files" --pattern seq --rw read "${common[@]}"
run 0 "bytes read and checked, [1-9][0-9]* bytes written and read back, 0 mismatched" \
  --backend memfs --pattern rand --rw mix "${common[@]}"
dd if=/dev/zero of="$dir/files/bench-0.dat" bs=4096 seek=3 count=1 conv=notrunc status=none
run 1 "VERIFY FAILED" --backend uring --dir "$dir/files" --pattern seq --rw read "${common[@]}"
run 0 "verify: off" --backend uring --dir "$dir/files" --pattern seq --rw read --no-verify "${common[@]}"
[ "$failures" -eq 0 ]
