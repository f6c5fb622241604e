#!/usr/bin/env bash
# bad_options_test.sh EXAMPLE KV_CACHE_DOC: the layer-wise example refuses nonsense options and unusable
# data folders fast, with exit code 2, a message naming the option (and the status code of what is
# wrong), and no layer file written; and every exit code KV_CACHE_DOC's table documents is what its
# example command gives.
set -euo pipefail
example=$(realpath "$1") doc=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
# expect_refused CODE WORD ARGS...: the example exits with CODE within 20 s, prints WORD, writes no layer file.
expect_refused() {
  local want=$1 word=$2
  shift 2
  local place=(--data-dir "$dir/data")
  [[ " $* " == *" --data-dir "* ]] && place=()  # the case names its own
  set +e
  timeout 20 "$example" "${place[@]}" --no-drop-caches --repeat 1 "$@" >"$dir/out.txt" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$word" "$dir/out.txt" || ls "$dir"/data/layer-* >/dev/null 2>&1; then
    echo "FAIL: $* -> exit $rc (want $want, message with '$word', no layer files):"
    cat "$dir/out.txt"
    ls -l "$dir/data" 2>/dev/null || true
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $rc: $(head -c 200 "$dir/out.txt" | head -1)"
  fi
  rm -rf "$dir/data"
}
# NaN passes CLI::Range (every comparison is false) and used to run with an undefined compute time.
expect_refused 2 "--compute-ms" --backend memfs --layers 1 --context-tokens 256 --compute-ms nan
# 1024 layers x 2^24 chunks x 2 x 1 GiB = 2^65 bytes wrapped to 0: the free-space check passed and the
# example began writing a 2^55-byte layer file.
expect_refused 2 "exceeds the limit" --backend uring --layers 1024 --context-tokens 16777216 --tokens-per-block 1 \
  --tensor-bytes 1073741824
expect_refused 2 "multiple of 4096" --backend uring --layers 1 --tensor-bytes 6144
expect_refused 2 "exceeds --context-tokens" --backend uring --layers 1 --context-tokens 256 --tokens-per-block 512
# A model shape whose tensor is not 4096-byte aligned: the message says which --tokens-per-block would be.
expect_refused 2 "make --tokens-per-block a multiple of 2" --backend uring --model mistral-7b --tokens-per-block 1 \
  --kv-heads 1 --head-dim 1024 --context-tokens 16
expect_refused 2 "--model" --model llama-9
expect_refused 2 "excludes" --tensor-bytes 65536 --kv-heads 4
# Out of CLI11's ranges, or not plain decimal numbers ("010" would be octal to CLI11).
expect_refused 2 "--layers" --layers 0
expect_refused 2 "--layers" --layers 010
expect_refused 2 "--compute-ms" --compute-ms -1
expect_refused 2 "--compute-ms" --compute-ms inf
expect_refused 2 "--hit-percent" --hit-percent 101
expect_refused 2 "--repeat" --repeat 0
# Flags that exclude each other, an unknown flag (CLI11's codes 108 and 109 before: now 2, documented).
expect_refused 2 "excludes" --verify --no-verify
expect_refused 2 "not expected" --no-such-flag
# --data-dir naming a file: INVALID_ARGUMENT naming the flag (it was DEVICE_ERROR about a lock file).
touch "$dir/a-file"
expect_refused 2 "INVALID_ARGUMENT: --data-dir '$dir/a-file' is not a directory" --backend uring --layers 1 \
  --data-dir "$dir/a-file"
expect_refused 2 "--prepare-only writes the layer files of the uring backend" --backend memfs --prepare-only
# --stripe-devices: 1 to 8 devices, for nvme-soft-striped only (refused before the root check and any mount).
expect_refused 2 "INVALID_ARGUMENT: --stripe-devices = 0 is out of range: expected 1 to 8" \
  --backend nvme-soft-striped --stripe-devices 0
expect_refused 2 "INVALID_ARGUMENT: --stripe-devices = 9 is out of range: expected 1 to 8" \
  --backend nvme-soft-striped --stripe-devices 9
expect_refused 2 "--stripe-devices" --backend nvme-soft-striped --stripe-devices 02
expect_refused 2 "--stripe-devices applies to --backend nvme-soft-striped, not --backend uring" --stripe-devices 2
expect_refused 2 "--prepare-only writes the layer files of the uring backend" --backend nvme-soft-striped --prepare-only
# The soft NVMe backends' free-space check counts their ext4 images (the data set's share, a quarter more and
# 64 MiB each), not the bare data set: a 1-layer set of 1 MiB does not fit a 48 MiB file system (root: tmpfs).
if [ "$(id -u)" -eq 0 ]; then
  mkdir -p "$dir/small"
  mount -t tmpfs -o size=48m tmpfs "$dir/small"
  expect_refused 2 "RESOURCE_EXHAUSTED: the ext4 image of --backend nvme-soft needs about" --backend nvme-soft \
    --layers 1 --context-tokens 256 --data-dir "$dir/small/data"
  expect_refused 2 "RESOURCE_EXHAUSTED: the ext4 images of --backend nvme-soft-striped need about" \
    --backend nvme-soft-striped --stripe-devices 2 --layers 1 --context-tokens 256 --data-dir "$dir/small/data"
  umount "$dir/small"
fi

# Every row of the doc's exit-code table whose last cell gives example arguments: run them (in a fresh
# data folder, as the table's commands are relative to it) and compare the exit code.
python3 - "$doc" >"$dir/table.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
rows = [r for r in section.splitlines() if re.match(r"^\| *\d+ *\|", r)]
assert rows, "no exit-code table under '### Exit codes'"
for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    for example in re.findall(r"`(--[^`]*)`", cells[-1]):  # example arguments start with an option
        print(f"{cells[0]}\t{example}")
PY
[ -s "$dir/table.txt" ] || { echo "FAIL: no examples in the exit-code table of $doc"; exit 1; }
touch "$dir/README.md"
while IFS=$'\t' read -r code args; do
  rm -rf "$dir/run"
  mkdir -p "$dir/run"
  set +e
  place=(--data-dir "$dir/run/data")
  [[ " $args " == *" --data-dir "* ]] && place=()  # the example names its own (relative to $dir)
  # shellcheck disable=SC2086  # the table's arguments, split as a shell would
  (cd "$dir" && timeout 120 "$example" "${place[@]}" --no-drop-caches $args) >"$dir/out.txt" 2>&1
  rc=$?
  set -e
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: the doc's exit code $code for '$args' is $rc here:"
    cat "$dir/out.txt"
    failures=$((failures + 1))
  else
    echo "ok: documented exit code $code: $args"
  fi
done <"$dir/table.txt"
[ "$failures" -eq 0 ] || { echo "FAIL: $failures case(s)"; exit 1; }
echo "all nonsense refused; every documented exit code checked"
