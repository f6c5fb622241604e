#!/usr/bin/env bash
# bench_options_test.sh SUBMIT_BENCH [LOCAL_NVME_BENCH], with DRIVE_BENCH optionally in the environment:
# the GPU benchmarks refuse nonsense flags with exit status 2 and a message naming the flag, before any
# GPU or file work (so this needs no GPU), and answer --help with 0. LOCAL_NVME_BENCH and DRIVE_BENCH
# exist in the cuda profile only.
set -euo pipefail
submit=$1 local_nvme=${2:-}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failures=0
# expect STATUS WORD BENCH ARGS...: the exit status and WORD in the output, within 10 s.
expect() {
  local want=$1 word=$2 bench=$3
  shift 3
  set +e
  timeout 10 "$bench" "$@" >"$out" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$word" "$out"; then
    echo "FAIL: $(basename "$bench") $* -> exit $rc (want $want, output with '$word'):"
    cat "$out"
    failures=$((failures + 1))
  else
    echo "ok: $(basename "$bench") $* -> exit $rc"
  fi
}
expect 2 "--depth" "$submit" --depth 0
expect 2 "--commands" "$submit" --commands abc
expect 2 "--stop-relay" "$submit" --stop-relay 2
expect 2 "--shapes" "$submit" --shapes 8:3
expect 2 "--shapes" "$submit" --shapes 8:x
expect 2 "--shapes" "$submit" --shapes 64:64
expect 2 "--batch-sizes" "$submit" --batch-sizes 0
expect 2 "--batch-sizes" "$submit" --batch-sizes 32,70000
expect 2 "--raw-threads" "$submit" --raw-threads x
expect 2 "--queues" "$submit" --queues 0
expect 2 "unknown\|--bogus\|extraneous" "$submit" --bogus 1
expect 0 "--batch-sizes" "$submit" --help
expect 2 "--commands" "$submit" --commands +4096
# DRIVE_BENCH (the environment; cuda profile): tutti-bench-gpu-drive.
if [ -n "${DRIVE_BENCH:-}" ]; then
  expect 2 "--in-flight" "$DRIVE_BENCH" --in-flight 0
  expect 2 "--in-flight" "$DRIVE_BENCH" --in-flight 5
  expect 2 "--controllers" "$DRIVE_BENCH" --controllers 1,5
  expect 2 "--submitters" "$DRIVE_BENCH" --submitters 0
  expect 2 "--cap-gbps" "$DRIVE_BENCH" --cap-gbps -1
  expect 2 "command slots" "$DRIVE_BENCH" --submitters 4 --in-flight 4
  expect 2 "command slots" "$DRIVE_BENCH" --iops-batch 4096 --submitters 4
  expect 2 "--files" "$DRIVE_BENCH" --files /nonexistent/tutti-bench-files
  expect 2 "block device" "$DRIVE_BENCH" --files /proc
  expect 2 "--striped" "$DRIVE_BENCH" --files / --striped
  expect 2 "--file-chunk-kib" "$DRIVE_BENCH" --files /proc --file-chunk-kib 6
  expect 2 "--files" "$DRIVE_BENCH" --files ""
  expect 2 "--file-count" "$DRIVE_BENCH" --file-count 2
  expect 2 "16384 MiB" "$DRIVE_BENCH" --files /proc --file-count 1024 --file-mib 4096
  expect 0 "--in-flight" "$DRIVE_BENCH" --help
fi
[ -n "$local_nvme" ] || { [ "$failures" -eq 0 ] || { echo "FAIL: $failures case(s)"; exit 1; }; echo "all nonsense refused"; exit 0; }
expect 2 "--batch" "$local_nvme" --batch -1
expect 2 "--queues" "$local_nvme" --queues 4294967298
expect 2 "--poll-budget-ns" "$local_nvme" --poll-budget-ns 2000000000
expect 2 "--file-mib" "$local_nvme" --file-mib 0
# CLI11 alone reads integers with base 0: "010" would be 8 and "0x10" 16; only decimal digits pass.
expect 2 "--batch" "$local_nvme" --batch 010
expect 2 "--poll-budget-ns" "$local_nvme" --poll-budget-ns 0x10
expect 2 "--dir" "$local_nvme" --dir ""
expect 0 "--poll-budget-ns" "$local_nvme" --help
[ "$failures" -eq 0 ] || { echo "FAIL: $failures case(s)"; exit 1; }
echo "all nonsense refused"
