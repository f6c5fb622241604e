#!/bin/sh
# The runtime's per-request submit cost before and after a change, as ratios from one run
# (docs/benchmarks.md, "Runtime submit cost"):
#
#   bench/tool/compare-submit-cost.sh BEFORE_REV [WORK_DIR] [ROUNDS]
#
# Builds the same benchmark sources twice (meson, debugoptimized, no tests or examples):
#   after   this tree;
#   before  BEFORE_REV's tree (git archive) with this tree's bench/tool/tutti_bench.cpp,
#           bench/local_nvme/bench_local_nvme.cpp and bench/support/verify_pattern.hpp copied in,
#           so only the library differs;
# then runs ROUNDS rounds (default 5), alternating before and after in each, of
#   tutti-bench --backend memfs, 4 KiB random reads, batch 64, queue depth 256, 2 s, --no-verify
#       (its "submit" figure: ns inside StorageRuntime::submit per request), and
#   bench_local_nvme --benchmark_filter=BM_RuntimeSubmitNull (ns inside submit per request over a
#       null-mode soft controller, batches of 1 and 64),
# and prints the median of each and the ratio after / before. Needs git, meson, python3.
set -eu
before_rev=${1:?usage: compare-submit-cost.sh BEFORE_REV [WORK_DIR] [ROUNDS]}
root=$(git rev-parse --show-toplevel)
work=${2:-$root/build-submit-cost}
rounds=${3:-5}
mkdir -p "$work"

# Extracted once per revision and copied only when changed, so a second run rebuilds nothing.
rev=$(git -C "$root" rev-parse "$before_rev")
if [ "$(cat "$work/before-src/.rev" 2>/dev/null)" != "$rev" ]; then
  rm -rf "$work/before-src" "$work/before"
  mkdir -p "$work/before-src"
  git -C "$root" archive "$rev" | tar -x -C "$work/before-src"
  echo "$rev" >"$work/before-src/.rev"
fi
for f in bench/tool/tutti_bench.cpp bench/local_nvme/bench_local_nvme.cpp bench/support/verify_pattern.hpp; do
  cmp -s "$root/$f" "$work/before-src/$f" || cp "$root/$f" "$work/before-src/$f"
done

targets="bench/tool/tutti-bench bench/local_nvme/bench_local_nvme"
for side in before after; do
  src=$root
  [ "$side" = before ] && src=$work/before-src
  if [ ! -f "$work/$side/build.ninja" ]; then
    meson setup "$work/$side" "$src" -Dtests=false -Dexamples=false -Ddaemon=false >/dev/null
  fi
  # shellcheck disable=SC2086
  meson compile -C "$work/$side" $targets >/dev/null
done

out=$work/results
rm -rf "$out"
mkdir -p "$out"
i=1
while [ "$i" -le "$rounds" ]; do
  for side in before after; do
    "$work/$side/bench/tool/tutti-bench" --backend memfs --pattern rand --rw read --block-size 4096 --batch 64 \
      --queue-depth 256 --files 1 --file-size 67108864 --seconds 2 --no-verify \
      --json "$out/memfs-$side-$i.json" >/dev/null
    "$work/$side/bench/local_nvme/bench_local_nvme" --benchmark_filter=BM_RuntimeSubmitNull \
      --benchmark_min_time=1 --benchmark_out="$out/null-$side-$i.json" --benchmark_out_format=json >/dev/null 2>&1
  done
  i=$((i + 1))
done

python3 - "$out" "$rounds" "$before_rev" <<'PY'
import json, statistics, sys
out, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def memfs(side):
    return [json.load(open(f"{out}/memfs-{side}-{i}.json"))["submit_ns_per_request"] for i in range(1, rounds + 1)]
def null(side, batch):
    values = []
    for i in range(1, rounds + 1):
        for b in json.load(open(f"{out}/null-{side}-{i}.json"))["benchmarks"]:
            if b["name"].startswith(f"BM_RuntimeSubmitNull/{batch}/"):
                values.append(b["submit_ns_per_request"])
    return values
rows = [("memfs, tutti-bench, batch 64", memfs("before"), memfs("after"))]
rows += [(f"local_nvme null controller, batch {n}", null("before", n), null("after", n)) for n in (1, 64)]
print(f"| submit cost per request (median of {rounds}) | before ({rev}) ns | after ns | after / before |")
print("|---|---|---|---|")
for name, before, after in rows:
    b, a = statistics.median(before), statistics.median(after)
    print(f"| {name} | {b:.0f} | {a:.0f} | {a / b:.2f} |")
PY
