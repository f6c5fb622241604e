#!/usr/bin/env bash
# tuttid_backend_test.sh EXAMPLE TUTTID TUTTICTL KV_CACHE_DOC: the layer-wise example with --backend nvme
# against a real tuttid (docs/daemon.md) on a soft controller over a fresh ext4 image, whose namespace tuttid
# loop-mounts itself. It runs example_test.sh's checks (every tensor verified, every summary line, the JSON,
# a corrupted tensor caught) with the data folder on that namespace; checks that the files read through the
# page cache after a run hold what the controller wrote (the example drops their cached pages); checks the
# refusals (an unknown controller, a data folder off the namespace, a lease over the pinned-byte budget, a
# controller without a namespace, no tuttid) by exit code 2 and message; and stops tuttid with SIGTERM: exit 0,
# the mount gone, the loop device detached. Then the namespace mounted beforehand (as an fstab line would): a new
# tuttid verifies that mount, the example runs verified on it, and tuttid leaves it mounted when it stops.
# Needs root (tuttid mounts); 77 otherwise.
set -euo pipefail
example=$1 tuttid=$2 tuttictl=$3 doc=$4
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: tuttid mounts the namespace's file system and needs root"; exit 77; fi
dir=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if mountpoint -q "$dir/mnt" 2>/dev/null; then umount "$dir/mnt" || umount -l "$dir/mnt"; fi
  losetup -j "$dir/ns.img" | cut -d: -f1 | xargs -r -n1 losetup -d
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "--- tuttid log"; cat "$dir/tuttid.log"; echo "FAIL: $*"; exit 1; }

truncate -s 128M "$dir/ns.img"
mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 "$dir/ns.img"
sock=$dir/tuttid.sock
# soft0: the namespace mounted at $dir/mnt (by tuttid: nothing is mounted there). tight: a controller with a
# pinned-byte budget too small for the example; bare: one that lists no namespace (both only ever refused; no
# file system on their images).
truncate -s 1M "$dir/tight.img"
truncate -s 1M "$dir/bare.img"
cat >"$dir/tuttid.json" <<EOF
{ "socket": {"path": "$sock"}, "state_file": "$dir/tuttid.state", "shutdown_grace_ms": 1000,
  "controllers": [
    {"name": "soft0", "soft": {"image": "$dir/ns.img"}, "io_queue_pairs": 6, "kernel_queues": 1, "queue_depth": 64,
     "namespaces": [{"nsid": 1, "mount": "$dir/mnt", "filesystem": "ext4"}],
     "client": {"max_queues": 4, "default_pinned_bytes": 1048576, "max_pinned_bytes": 67108864}},
    {"name": "tight", "soft": {"image": "$dir/tight.img"}, "io_queue_pairs": 2, "kernel_queues": 1, "queue_depth": 64,
     "client": {"max_queues": 1, "default_pinned_bytes": 65536, "max_pinned_bytes": 65536}},
    {"name": "bare", "soft": {"image": "$dir/bare.img"}, "io_queue_pairs": 2, "kernel_queues": 1, "queue_depth": 64,
     "client": {"max_queues": 1, "default_pinned_bytes": 1048576, "max_pinned_bytes": 67108864}}
  ] }
EOF
# Starts tuttid in the background ($pid) and waits (20 s at most) until it answers: it listens before it
# brings up its controllers and mounts, and answers only once they are up.
start_tuttid() {
  "$tuttid" --config "$dir/tuttid.json" 2>>"$dir/tuttid.log" &
  pid=$!
  for ((i = 0; i < 400; i++)); do
    [ -S "$sock" ] && "$tuttictl" --socket "$sock" status >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || fail "tuttid exited before listening"
    sleep 0.05
  done
  fail "tuttid did not listen within 20 s"
}
# SIGTERM, then waits (20 s at most); fails unless tuttid exits 0.
stop_tuttid() {
  kill -TERM "$pid"
  for ((i = 0; i < 400; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "tuttid did not exit within 20 s of SIGTERM"
  local rc=0
  wait "$pid" || rc=$?
  pid=
  [ "$rc" -eq 0 ] || fail "tuttid exited $rc after SIGTERM"
}
start_tuttid
mountpoint -q "$dir/mnt" || fail "tuttid did not mount the namespace at $dir/mnt"
"$tuttictl" --socket "$sock" devices | grep -q "1:$dir/mnt (mounted from /dev/loop" || {
  "$tuttictl" --socket "$sock" devices; fail "tuttictl devices does not show the namespace mounted by tuttid"; }

# The example's own checks, with the data folder on the namespace.
data=$dir/mnt/kv
LAYERWISE_EXAMPLE_ARGS="--controller soft0 --tuttid-socket $sock" LAYERWISE_DATA_DIR=$data \
  "$here/example_test.sh" "$example" nvme "$doc" || fail "example_test.sh nvme"
grep -q "lease 1 granted" "$dir/tuttid.log" || fail "no lease was granted"

data2=$dir/mnt/kv2
args=(--backend nvme --controller soft0 --tuttid-socket "$sock" --lease-queues 2 --layers 6 --context-tokens 1024
      --tokens-per-block 256 --tensor-bytes 65536 --data-dir "$data2" --no-drop-caches --repeat 2 --compute-ms 0.5)
# Page cache: the files' pages cached before a run would hide what the controller writes from a later buffered
# read. Cache them, run (rewriting the missed chunks through the leased queues, twice), then compare every
# layer file read through the page cache with the same file read with O_DIRECT.
for pass in prepare check; do  # a fresh data folder (example_test.sh left a corrupted tensor in its own)
  rc=0
  "$example" "${args[@]}" >"$dir/out.txt" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { cat "$dir/out.txt"; fail "the $pass run exited $rc"; }
  [ "$pass" = check ] || cat "$data2"/layer-*.kv >/dev/null
done
grep -q "0 mismatched -> VERIFIED" "$dir/out.txt" || { cat "$dir/out.txt"; fail "no VERIFIED line"; }
grep -qE "^  lease          : lease [0-9]+ of tuttid on controller soft0: 2 queues \(IDs [0-9]+,[0-9]+\) of depth 64, namespace 1 \(/dev/loop[0-9]+ on $dir/mnt\)$" \
  "$dir/out.txt" || { cat "$dir/out.txt"; fail "no lease line of 2 queues"; }
for f in "$data2"/layer-*.kv; do
  cmp <(cat "$f") <(dd if="$f" iflag=direct bs=65536 status=none) >/dev/null ||
    fail "$f read through the page cache differs from its bytes on the device after the run"
done
echo "buffered reads after the run see what the controller wrote"

# Refusals: exit code 2 and a message naming what to change.
refused() {
  local want=$1
  shift
  local rc=0
  "$example" "$@" >"$dir/refused.txt" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$dir/refused.txt"; fail "$* exited $rc, expected 2"; }
  grep -qF -- "$want" "$dir/refused.txt" || { cat "$dir/refused.txt"; fail "$*: no '$want' in the message"; }
  echo "refused as expected: $want"
}
small=(--layers 6 --context-tokens 1024 --tokens-per-block 256 --tensor-bytes 65536 --no-drop-caches --repeat 1)
refused 'tuttid answered not_found: acquire: no controller named "nope": --controller must name a controller' \
  --backend nvme --controller nope --tuttid-socket "$sock" --data-dir "$data" "${small[@]}"
# A data folder off the namespace: refused before any queue is leased (tuttid grants none), naming --data-dir, its
# value and the mount point it must be under.
granted() { "$tuttictl" --socket "$sock" metrics | sed -n 's/^tuttid_leases_total{event="granted"} //p'; }
granted_before=$(granted)
mkdir -p "$dir/off"
refused "--data-dir '$dir/off' is not on namespace 1 of controller soft0: give a folder under '$dir/mnt', where tuttid" \
  --backend nvme --controller soft0 --tuttid-socket "$sock" --data-dir "$dir/off" "${small[@]}"
grep -qE "has its ext4 file system mounted from /dev/loop[0-9]+ \([0-9]+:[0-9]+\); '$dir/off' is on device [0-9]+:[0-9]+ " \
  "$dir/refused.txt" || { cat "$dir/refused.txt"; fail "the data-dir refusal does not name the devices"; }
# A path through the mount point that leaves it again: refused, and nothing created on the way.
refused "--data-dir '$dir/elsewhere' is not on namespace 1 of controller soft0: give a folder under '$dir/mnt'" \
  --backend nvme --controller soft0 --tuttid-socket "$sock" --data-dir "$dir/mnt/missing/../../elsewhere" "${small[@]}"
[ ! -e "$dir/elsewhere" ] && [ ! -e "$dir/mnt/missing" ] || fail "a refused --data-dir with .. created folders"
[ "$(granted)" = "$granted_before" ] ||
  fail "a --data-dir off the namespace was refused only after a lease: $granted_before, then $(granted) leases granted"
refused "--lease-queues = 99999999999 is out of range: expected 1 to 64" --backend nvme --controller soft0 \
  --tuttid-socket "$sock" --lease-queues 99999999999 "${small[@]}"
refused "--tuttid-socket is empty" --backend nvme --controller soft0 --tuttid-socket "" "${small[@]}"
refused "--tuttid-socket '$dir/tuttid.json' is not a socket" --backend nvme --controller soft0 \
  --tuttid-socket "$dir/tuttid.json" "${small[@]}"
refused "lower --lease-queues 5 to at most client.max_queues of controller soft0" --backend nvme --controller soft0 \
  --tuttid-socket "$sock" --lease-queues 5 --data-dir "$data" "${small[@]}"
# The data folder's lock is taken before the lease: a run refused for the lock never held queues (here its
# --lease-queues 5, above client.max_queues, would be refused by tuttid only once it asked).
mkdir -p "$data"
(
  exec 9>"$data/layerwise.lock"
  flock 9
  exec sleep 30 # the holder of the lock (and of fd 9): $holder
) &
holder=$!
for _ in $(seq 100); do flock -n "$data/layerwise.lock" true || break; sleep 0.05; done
refused "is in use by another layerwise_kv_overlap run" --backend nvme --controller soft0 --tuttid-socket "$sock" \
  --lease-queues 5 --data-dir "$data" "${small[@]}"
kill "$holder"
wait "$holder" 2>/dev/null || true
refused "above client.max_pinned_bytes 65536 of controller tight" --backend nvme --controller tight \
  --tuttid-socket "$sock" --data-dir "$data" "${small[@]}"
grep -qF "this shape needs a lease of" "$dir/refused.txt" || { cat "$dir/refused.txt"; fail "no budget hint"; }
grep -qF "acquire tight (1 queue, " "$dir/refused.txt" || { cat "$dir/refused.txt"; fail "one queue not counted as 1 queue"; }
refused "controller bare lists no namespace 1 in tuttid's configuration" --backend nvme --controller bare \
  --tuttid-socket "$sock" "${small[@]}"
refused "--backend nvme needs --controller NAME" --backend nvme --tuttid-socket "$sock" "${small[@]}"

# SIGTERM: tuttid exits 0 (no lease is held), unmounts what it mounted and detaches its loop device.
stop_tuttid
mountpoint -q "$dir/mnt" && fail "$dir/mnt is still mounted after tuttid stopped"
[ -z "$(losetup -j "$dir/ns.img")" ] || { losetup -j "$dir/ns.img"; fail "a loop device still holds the image"; }
echo "tuttid stopped: exit 0, namespace unmounted, loop device detached"
refused "is tuttid running?" --backend nvme --controller soft0 --tuttid-socket "$sock" --data-dir "$dir/off" \
  "${small[@]}"

# Mounted beforehand: tuttid verifies the mount (a loop device of its image), the example runs on it, and
# tuttid leaves it mounted when it stops.
mount -o loop "$dir/ns.img" "$dir/mnt"
start_tuttid
"$tuttictl" --socket "$sock" devices | grep -q "1:$dir/mnt (verified from /dev/loop" || {
  "$tuttictl" --socket "$sock" devices; fail "tuttictl devices does not show the namespace verified"; }
rc=0
"$example" --backend nvme --controller soft0 --tuttid-socket "$sock" --data-dir "$data2" "${small[@]}" \
  --no-pread-baseline >"$dir/out.txt" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$dir/out.txt"; fail "the run on the verified mount exited $rc"; }
grep -q "0 mismatched -> VERIFIED" "$dir/out.txt" || { cat "$dir/out.txt"; fail "no VERIFIED line"; }
grep -qE "^  lease          : lease [0-9]+ of tuttid on controller soft0: 1 queue \(ID [0-9]+\) of depth 64, namespace 1 \(/dev/loop[0-9]+ on $dir/mnt\)$" \
  "$dir/out.txt" || { cat "$dir/out.txt"; fail "no lease line of 1 queue"; }
stop_tuttid
mountpoint -q "$dir/mnt" || fail "tuttid unmounted a mount it did not make"
echo "a mount made beforehand: verified, used, and left mounted"
