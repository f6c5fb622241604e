#!/usr/bin/env bash
# plot_bench_test.sh PLOT_BENCH: scripts/plot-bench prints its usage and a one-line error, never a Python
# traceback, when matplotlib is missing (python3 -S: no site packages) or an input is not a tutti-bench
# result; with python3-matplotlib installed (scripts/install-deps) it writes both PNGs.
set -euo pipefail
plot=$1
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/a.json" <<'JSON'
{"backend": "uring", "memory": "host", "pattern": "rand", "rw": "read", "queue_depth": 8, "block_size": 4096,
 "mb_per_s": 812.5, "latency_us": {"p50": 30.1, "p99": 80.2, "p99.9": 120.3}}
JSON
sed 's/"block_size": 4096/"block_size": 65536/; s/812.5/2400.0/' "$dir/a.json" >"$dir/b.json"
echo '{"backend": "uring"}' >"$dir/not-a-result.json"
# expect_clean_failure WORD COMMAND...: exit 2, WORD in the output, no traceback.
expect_clean_failure() {
  local word=$1 rc=0
  shift
  "$@" >"$dir/out.txt" 2>&1 || rc=$?
  if [ "$rc" -ne 2 ] || grep -q Traceback "$dir/out.txt" || ! grep -q -- "$word" "$dir/out.txt"; then
    cat "$dir/out.txt"
    echo "FAIL: $* -> exit $rc (want 2, '$word', no traceback)"
    exit 1
  fi
  echo "ok: $(tail -1 "$dir/out.txt")"
}
expect_clean_failure "python3-matplotlib is not installed" "$python" -S "$plot" "$dir/out" "$dir/a.json"
grep -q "scripts/plot-bench OUT_DIR" "$dir/out.txt" || { echo "FAIL: no usage text"; exit 1; }
expect_clean_failure "scripts/plot-bench OUT_DIR" "$python" "$plot"
expect_clean_failure "not a tutti-bench result" "$python" "$plot" "$dir/out" "$dir/not-a-result.json"
expect_clean_failure "No such file" "$python" "$plot" "$dir/out" "$dir/missing.json"
if ! "$python" -c "import matplotlib" 2>/dev/null; then
  echo "SKIP: python3-matplotlib not installed (scripts/install-deps installs it): no PNGs drawn"
  exit 77
fi
"$python" "$plot" "$dir/out" "$dir/a.json" "$dir/b.json"
for png in throughput-vs-block-size.png latency-percentiles.png; do
  head -c 8 "$dir/out/$png" | od -An -c | grep -q "P   N   G" || { echo "FAIL: $png is not a PNG"; exit 1; }
done
echo "both plots written"
