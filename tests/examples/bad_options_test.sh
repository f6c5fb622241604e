#!/usr/bin/env bash
# bad_options_test.sh EXAMPLE: the layer-wise example refuses nonsense options fast, with exit code 2
# (its own checks) or CLI11's validation code, a message naming the option, and no data written.
set -euo pipefail
example=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
# expect_refused CODE WORD ARGS...: the example exits with CODE within 20 s, prints WORD, writes no file.
expect_refused() {
  local want=$1 word=$2
  shift 2
  set +e
  timeout 20 "$example" --data-dir "$dir/data" --no-drop-caches "$@" >"$dir/out.txt" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$word" "$dir/out.txt" || [ -n "$(ls -A "$dir/data" 2>/dev/null)" ]; then
    echo "FAIL: $* -> exit $rc (want $want, message with '$word', no data files):"
    cat "$dir/out.txt"
    ls -l "$dir/data" 2>/dev/null || true
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $rc"
  fi
  rm -rf "$dir/data"
}
# NaN passes CLI::Range (every comparison is false) and used to run with an undefined compute time.
expect_refused 2 "--compute-ms" --backend memfs --layers 1 --context-tokens 256 --compute-ms nan
# 1024 layers x 2^24 chunks x 2 x 1 GiB = 2^65 bytes wrapped to 0: the free-space check passed and the
# example began writing a 2^55-byte layer file.
expect_refused 2 "exceeds the limit" --backend uring --layers 1024 --context-tokens 16777216 --chunk-tokens 1 \
  --tensor-bytes 1073741824
expect_refused 2 "multiple of 4096" --backend uring --layers 1 --tensor-bytes 6144
expect_refused 2 "exceeds --context-tokens" --backend uring --layers 1 --context-tokens 256 --chunk-tokens 512
# Out of CLI11's ranges (its ValidationError exit code, 105).
expect_refused 105 "--layers" --layers 0
expect_refused 105 "--compute-ms" --compute-ms -1
expect_refused 105 "--compute-ms" --compute-ms inf
expect_refused 105 "--hit-percent" --hit-percent 101
[ "$failures" -eq 0 ] || { echo "FAIL: $failures case(s)"; exit 1; }
echo "all nonsense refused"
