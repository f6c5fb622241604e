#!/usr/bin/env bash
# uring_vs_fio_verify_test.sh URING_VS_FIO: uring_vs_fio --verify checks every block its uring side reads.
# A clean run over a 4 MiB pattern file exits 0 and reports checked bytes with 0 mismatched blocks; after
# one 4096-byte block in the middle of the file is overwritten with zeros (the first and last blocks still
# hold the pattern, so the file is not rewritten), the run reports VERIFY FAILED and exits 1; --no-verify
# says that its MB/s is of unchecked bytes. About 10 s (1 s per measurement, uring and fio).
set -euo pipefail
bench=$1
command -v fio >/dev/null || { echo "fio not installed"; exit 77; }
dir=$(mktemp -d /var/tmp/tutti-uring-vs-fio-verify-XXXXXX)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/verify_run.sh"  # run EXPECTED_EXIT PATTERN ARGS...
common=(--file "$dir/pattern.dat" --size 4194304 --iodepth 8 --batch 4 --seconds 1 --repeat 1)
run 0 "verify: uring side: [1-9][0-9]* bytes read and checked against the file's pattern, 0 mismatched" "${common[@]}"
dd if=/dev/zero of="$dir/pattern.dat" bs=4096 seek=300 count=1 conv=notrunc status=none
run 1 "[1-9][0-9]* mismatched 4096-byte blocks -> VERIFY FAILED" "${common[@]}"
run 0 "verify: off" "${common[@]}" --no-verify
[ "$failures" -eq 0 ]
