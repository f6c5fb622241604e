#!/usr/bin/env bash
# example_test.sh EXAMPLE BACKEND KV_CACHE_DOC [gpu]: runs the layer-wise example on a small shape in a fresh
# data directory and checks that it verifies and prints every summary line KV_CACHE_DOC
# (docs/kv-cache.md) lists; then corrupts one cached tensor on disk (uring: a layer file; nvme-soft-striped:
# a shard file inside its ext4 image) and checks that the example fails with exit code 1 and names the
# mismatch. BACKEND nvme-soft-striped:N runs --backend nvme-soft-striped --stripe-devices N and also checks
# that every one of the N soft controllers moved tensors. BACKEND nvme needs a running tuttid: the caller
# (tuttid_backend_test.sh) names it in LAYERWISE_EXAMPLE_ARGS (--controller, --tuttid-socket) and puts the data
# folder on the leased namespace's file system with LAYERWISE_DATA_DIR.
set -euo pipefail
example=$1 backend=$2 doc=$3 gpu=${4:-}
stripe=
case "$backend" in nvme-soft-striped:*) stripe=${backend#*:} backend=nvme-soft-striped ;; esac
case "$backend" in
  nvme-soft*)
    if [ "$(id -u)" -ne 0 ]; then echo "SKIP: $backend needs root"; exit 77; fi
    # The cuda build's nvme-soft backends run local_nvme's kernels on a GPU (the soft controllers in
    # accelerator_mode need one): without a usable GPU they skip.
    if "$example" --help 2>/dev/null | grep -q -- "--memory"; then
      if ! { nvidia-smi -L >/dev/null 2>&1 || [ -e /dev/nvidia0 ]; }; then
        echo "SKIP: $backend in the cuda build needs a GPU"
        exit 77
      fi
    fi
    ;;
esac
# gpu: the run must have put the KV slots in GPU memory (the cuda build, --memory device).
extra=()
[ "$gpu" = gpu ] && extra=(--memory device --compute sleep)
dir=$(mktemp -d)
# (the striped case mounts a shard's image at $dir/corrupt for a moment: unmount it before removing)
trap 'if mountpoint -q "$dir/corrupt" 2>/dev/null; then umount "$dir/corrupt"; fi; rm -rf "$dir"' EXIT
data=${LAYERWISE_DATA_DIR:-$dir/data}
read -r -a caller_args <<<"${LAYERWISE_EXAMPLE_ARGS:-}"
base=(--backend "$backend" --layers 6 --context-tokens 1024 --tokens-per-block 256 --tensor-bytes 65536
      --data-dir "$data" --no-drop-caches --repeat 1 ${stripe:+--stripe-devices "$stripe"} "${caller_args[@]}")
args=("${base[@]}" "${extra[@]}" --compute-ms 0.5 --json "$dir/report.json")
# After every run of an nvme-soft backend: nothing stays mounted under the data directory and no loop
# device holds one of its images (the example detaches what it attached, on every exit path).
released() {
  if grep -qF " $dir/data" /proc/self/mounts; then grep -F " $dir/data" /proc/self/mounts; echo "FAIL: $1: still mounted"; exit 1; fi
  local image
  for image in "$dir"/data/nvme-soft*/*.img; do
    [ -e "$image" ] || continue
    if [ -n "$(losetup -j "$image")" ]; then losetup -j "$image"; echo "FAIL: $1: loop device still attached"; exit 1; fi
  done
}
rc=0
"$example" "${args[@]}" >"$dir/out.txt" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$dir/out.txt"; echo "FAIL: example exited $rc"; exit 1; }
released "first run"
grep -q "0 mismatched -> VERIFIED" "$dir/out.txt" || { cat "$dir/out.txt"; echo "FAIL: no VERIFIED line"; exit 1; }
# Every check is counted, per source: 6 layers x 3 cached chunks x 2 tensors per read pass (restore,
# the pread baselines on file backends: 1 thread, and 6 threads = the 6 requests per layer Tutti keeps
# in flight; the pipeline) + 6 x 1 missed chunk x 2 written tensors. The cuda build (KV slots in GPU
# memory) names its pread baseline "pread+cudaMemcpy" and may add cuFile passes (36 each); the JSON
# check below holds the exact numbers either way.
if [ "$backend" = memfs ]; then checked="84 tensors checked \(restore 36, pipeline 36, written 12;"
else
  checked="tensors checked \(restore 36, pread(\+cudaMemcpy)? 36, (pread x6 36, )?(cuFile( x8)? 36, )*pipeline 36, "
  checked+="written 12;"
fi
grep -qE "$checked" "$dir/out.txt" || { cat "$dir/out.txt"; echo "FAIL: no line matching '$checked'"; exit 1; }
# The verdict line: one sentence ending with every tensor verified.
grep -qE '^  verdict        : .*the pipeline was (compute|reads|writes)-bound; every tensor verified \([0-9]+\)$' "$dir/out.txt" ||
  { cat "$dir/out.txt"; echo "FAIL: no verdict line"; exit 1; }
# The verdict: what bounded the pipeline, per layer, the same in the text and in the JSON.
verdict_line='^  per layer      : restore alone [0-9.]* ms, \(GPU \)\?compute [0-9.]* ms, pipeline [0-9.]* ms: '
verdict_line+='\(compute\|read\|write\)-bound: compute waited [0-9.]* ms for IO, .*'
verdict=$(sed -n "s/$verdict_line/\\2/p" "$dir/out.txt")
[ -n "$verdict" ] || { cat "$dir/out.txt"; echo "FAIL: no 'per layer' verdict line"; exit 1; }
python3 - "$dir/report.json" "$backend" "$verdict" "$stripe" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
backend, verdict, stripe = sys.argv[2], sys.argv[3], sys.argv[4]
assert r["backend"] == backend, r["backend"]
if stripe:  # every layer striped over the N devices, one K or V tensor per unit
    assert r["shape"]["stripe"] == {"devices": int(stripe), "unit_bytes": 65536}, r["shape"]
else:
    assert "stripe" not in r["shape"], r["shape"]
# 6 layers x 3 cached chunks x 2 tensors, read in the restore and pipeline phases, + written tensors read back.
assert r["restore_only"]["requests"] == 36, r
assert r["pipeline_reads"]["requests"] == 36, r
assert r["pipeline_writes"]["requests"] == 12, r
assert r["restore_only"]["bytes"] == 36 * 65536, r
sources = r["verified_tensors_by_source"]
expected = {"restore": 36, "pipeline": 36, "written": 12}
if backend != "memfs":  # the pread baselines; the cuda build's is one, named pread+cudaMemcpy
    if "pread+cudaMemcpy" in sources:
        expected["pread+cudaMemcpy"] = 36
    else:
        expected["pread"] = 36
        # As many threads as requests Tutti kept in flight: a layer's 6 cached tensors, one submit.
        assert r["restore_max_in_flight"] == 6, r
        assert r["pread_parallel"]["threads"] == 6 and r["pread_parallel"]["requests"] == 36, r
        expected["pread x6"] = 36
for extra in ("cuFile", "cuFile x8"):  # cuda build, where cuFile could open the files
    if extra in sources:
        expected[extra] = 36
assert sources == expected, (sources, expected)
assert r["mismatched_tensors"] == 0 and r["verified_tensors"] == sum(expected.values()), r
assert r["bound"] == {"compute": "compute", "read": "reads", "write": "writes"}[verdict], (r["bound"], verdict)
assert r["repeat"] == 1 and len(r["runs"]) == 1, r
if backend == "nvme":  # the lease's controller and namespace (tuttid_backend_test.sh leases soft0's)
    assert r["tuttid"] == {"controller": "soft0", "nsid": 1}, r.get("tuttid")
else:
    assert "tuttid" not in r, r["tuttid"]
PY
# The restore against each pread baseline: the JSON's verdict beside the ratio's spread, the same as the
# verdict line's words (null and no words for a baseline that was not measured).
python3 - "$dir/report.json" "$dir/out.txt" <<'PY' || { cat "$dir/out.txt"; echo "FAIL: the comparisons differ"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
line = [l.rstrip("\n") for l in open(sys.argv[2]) if l.startswith("  verdict        : ")][0]
parts = line.split(" : ", 1)[1].split("; ")
words = {"beat": "restore beat ", "slower": "restore was slower than ", "matched": "restore matched ",
         "inconclusive": "restore against "}
measured = []
for key in ("tutti_over_pread", "tutti_over_pread_parallel"):
    s = r["spread"][key]
    assert set(s) == {"median", "min", "max", "runs", "verdict"}, (key, s)
    if s["runs"] == 0:
        assert s["verdict"] is None, (key, s)
    else:
        measured.append(s["verdict"])
comparisons = [p for p in parts if p.startswith("restore ")]
assert len(comparisons) == len(measured), (comparisons, measured)
for verdict, words_printed in zip(measured, comparisons):
    assert words_printed.startswith(words[verdict]), (verdict, words_printed)
    assert (verdict == "inconclusive") == (" inconclusive: " in words_printed), (verdict, words_printed)
PY
if [ "$gpu" = gpu ]; then
  python3 - "$dir/report.json" <<'PY' || { cat "$dir/out.txt"; echo "FAIL: the KV slots were not in GPU memory"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r.get("memory") == "DEVICE", r.get("memory")
PY
  line="local_nvme     : "
  [ -z "$stripe" ] || line="striped_nvme   : "
  grep -q "^  $line" "$dir/out.txt" || { cat "$dir/out.txt"; echo "FAIL: no '$line' line"; exit 1; }
  echo "KV slots in GPU memory, every tensor verified through local_nvme's GPU kernels${stripe:+ (striped_nvme over $stripe controllers)}"
fi
echo "clean run verified ($verdict-bound)"

# The summary's lines as docs/kv-cache.md lists them (its block under "## The example's summary"): every
# label there is printed, so the doc cannot drift from the program.
labels=$(python3 - "$doc" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = text.split("## The example's summary", 1)[1].split("```", 2)[1]
for line in block.splitlines():
    m = re.match(r"^  (\S[^:]*?)\s*: ", line)
    if m:
        print(m.group(1))
PY
)
[ -n "$labels" ] || { echo "FAIL: no summary lines found in $doc"; exit 1; }
while IFS= read -r label; do
  case "$label" in
    warning) continue ;;                                               # only for a RAM-backed data folder
    note) [[ "$backend" == nvme* ]] || continue ;;                     # only for the NVMe backends
    "pread 1 thread") [ "$backend" != memfs ] || continue ;;           # memfs has no files to pread
    "pread N thr") [ "$backend" != memfs ] || continue; label="pread [0-9]+ thr" ;;
  esac
  if grep -q "^  device         : " "$dir/out.txt"; then  # cuda build, KV slots in GPU memory: its own baselines
    [ "$label" = "pread 1 thread" ] && label="pread\+memcpy"
    [ "$label" = "compute" ] && label="GPU compute"
    [ "$label" = "pread [0-9]+ thr" ] && continue
  fi
  grep -qE "^  $label +: " "$dir/out.txt" ||
    { cat "$dir/out.txt"; echo "FAIL: no '$label' line, which $doc lists"; exit 1; }
done <<<"$labels"
echo "every summary line of $(basename "$doc") printed"

# Verdicts that do not depend on the machine's speed: 20 ms of compute per layer hides 8 reads of 64 KiB
# (memfs: host memory); with no compute and every chunk cached, compute waits only for reads.
expect_bound() {
  local want=$1
  shift
  local rc=0
  "$example" "${base[@]}" "$@" --no-pread-baseline >"$dir/out3.txt" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { cat "$dir/out3.txt"; echo "FAIL: $* exited $rc"; exit 1; }
  grep -q "^  per layer      : .*: $want-bound: " "$dir/out3.txt" ||
    { cat "$dir/out3.txt"; echo "FAIL: $* is not $want-bound"; exit 1; }
  echo "$want-bound as expected: $*"
}
case "$backend" in
  memfs) expect_bound compute --compute-ms 20 ;;
  uring) expect_bound read --compute-ms 0 --hit-percent 100 ;;
esac
if [ -n "$stripe" ]; then
  # The stripe: one striped_nvme line naming the N controllers, and every soft device answered NVMe I/O
  # commands and read tensors (6 layers x 24 units of 64 KiB round robin: at least 2 per device).
  grep -qE "^  striped_nvme   : $stripe controllers, unit 64 KiB, [1-9][0-9]* launches, 0 Aborts sent$" "$dir/out.txt" ||
    { cat "$dir/out.txt"; echo "FAIL: no striped_nvme line for $stripe controllers"; exit 1; }
  for ((i = 0; i < stripe; i++)); do
    grep -qE "^  soft device $i +: [1-9][0-9]* NVMe I/O commands, .* 0 errors, 0 DMA faults$" "$dir/out.txt" ||
      { cat "$dir/out.txt"; echo "FAIL: soft device $i moved nothing or failed"; exit 1; }
  done
  [ "$(grep -c '^  soft device ' "$dir/out.txt")" -eq "$stripe" ] ||
    { cat "$dir/out.txt"; echo "FAIL: not exactly $stripe soft device lines"; exit 1; }
  echo "striped over $stripe soft controllers, each of them moving tensors"
  # Corrupt layer 2, chunk 1, V tensor in its shard: logical unit 2*1+1 = 3 of 64 KiB lies on shard 3 % N at
  # shard offset (3 / N) * 65536 (docs/striping.md). The shard file is inside that shard's ext4 image: mount
  # it, write two bytes, unmount; the next run finds its data set complete and reads it as it is.
  shard=$((3 % stripe)) offset=$(((3 / stripe) * 65536 + 100))
  mnt=$dir/corrupt
  mkdir -p "$mnt"
  mount -o loop "$dir/data/nvme-soft-striped/disk-$shard.img" "$mnt"
  printf '\xff\x00' | dd of="$mnt/layer-00002.kv" bs=1 seek="$offset" conv=notrunc,fsync status=none
  umount "$mnt"
  # An image of a device this run does not use (left by a run with more --stripe-devices) is removed.
  stale=$dir/data/nvme-soft-striped/disk-7.img
  truncate -s 1M "$stale"
  set +e
  "$example" "${args[@]}" --no-pread-baseline >"$dir/out2.txt" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 1 ]; then cat "$dir/out2.txt"; echo "FAIL: a corrupted shard gave exit code $rc, expected 1"; exit 1; fi
  released "the run that found the corrupted shard"
  grep -q "layer 2 chunk 1 V" "$dir/out2.txt" || { cat "$dir/out2.txt"; echo "FAIL: mismatch not named"; exit 1; }
  echo "corruption in shard $shard detected"
  [ ! -e "$stale" ] || { echo "FAIL: the stale image disk-7.img of an unused device is still there"; exit 1; }
  echo "the stale image of an unused device was removed"
  exit 0
fi
# The corruption check edits plain files in the data directory (nvme: on the leased namespace's file system,
# through its page cache: the example must see the bytes on the device, which sync puts there).
[ "$backend" = uring ] || [ "$backend" = nvme ] || exit 0
# The 100% run rewrote the data set; write the 75% one back before corrupting it.
rc=0
"$example" "${args[@]}" --no-pread-baseline >"$dir/out.txt" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$dir/out.txt"; echo "FAIL: rerun exited $rc"; exit 1; }

# Corrupt one byte of layer 2, chunk 1, V tensor (the store's layout: slot 1, piece 1): (2*1+1) * 65536 + 100.
printf '\xff' | dd of="$data/layer-00002.kv" bs=1 seek=$((3 * 65536 + 100)) conv=notrunc status=none
printf '\x00' | dd of="$data/layer-00002.kv" bs=1 seek=$((3 * 65536 + 101)) conv=notrunc status=none
sync
set +e
"$example" "${args[@]}" --no-pread-baseline >"$dir/out2.txt" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ]; then cat "$dir/out2.txt"; echo "FAIL: corrupted data gave exit code $rc, expected 1"; exit 1; fi
grep -q "layer 2 chunk 1 V" "$dir/out2.txt" || { cat "$dir/out2.txt"; echo "FAIL: mismatch not named"; exit 1; }
echo "corruption detected"
