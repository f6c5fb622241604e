#!/usr/bin/env bash
# filesystems_test.sh EXAMPLE: the data folder's file system, checked before anything is written (root:
# it mounts ramfs and tmpfs). On ramfs, which has no O_DIRECT, the example refuses with exit code 2 and
# the O_DIRECT message naming --data-dir and ramfs, not a free-space message (ramfs reports 0 bytes
# free, which used to fire first). On tmpfs the summary names the file system and warns that the
# figures are memory's (kernels whose tmpfs has no O_DIRECT refuse it like ramfs instead).
set -euo pipefail
example=$1
[ "$(id -u)" -eq 0 ] || { echo "SKIP: mounting ramfs and tmpfs needs root"; exit 77; }
dir=$(mktemp -d)
mounted=()
cleanup() {
  for m in "${mounted[@]}"; do umount "$m" || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/ramfs" "$dir/tmpfs"
mount -t ramfs ramfs "$dir/ramfs" && mounted+=("$dir/ramfs")
mount -t tmpfs -o size=64m tmpfs "$dir/tmpfs" && mounted+=("$dir/tmpfs")
args=(--layers 2 --context-tokens 512 --tensor-bytes 65536 --repeat 1 --no-drop-caches --json "$dir/report.json")

rc=0
timeout 60 "$example" "${args[@]}" --data-dir "$dir/ramfs/kv" >"$dir/out.txt" 2>&1 || rc=$?
cat "$dir/out.txt"
[ "$rc" -eq 2 ] || { echo "FAIL: ramfs gave exit code $rc, expected 2"; exit 1; }
grep -qF "UNSUPPORTED: --data-dir '$dir/ramfs/kv' is on ramfs, which does not support O_DIRECT" "$dir/out.txt" ||
  { echo "FAIL: no O_DIRECT message naming --data-dir and ramfs"; exit 1; }
if grep -q "available" "$dir/out.txt"; then echo "FAIL: the free-space check spoke first"; exit 1; fi
if ls "$dir"/ramfs/kv/layer-* >/dev/null 2>&1; then echo "FAIL: layer files written on ramfs"; exit 1; fi
echo "ramfs refused for O_DIRECT, before the free-space check"

rc=0
timeout 120 "$example" "${args[@]}" --data-dir "$dir/tmpfs/kv" >"$dir/out.txt" 2>&1 || rc=$?
cat "$dir/out.txt"
if [ "$rc" -eq 2 ] && grep -qF "is on tmpfs, which does not support O_DIRECT" "$dir/out.txt"; then
  echo "this kernel's tmpfs has no O_DIRECT: refused like ramfs"
  exit 0
fi
[ "$rc" -eq 0 ] || { echo "FAIL: tmpfs run exited $rc"; exit 1; }
grep -qE "^  data           : .* in '$dir/tmpfs/kv' \(tmpfs\)$" "$dir/out.txt" ||
  { echo "FAIL: the header does not name the folder and tmpfs"; exit 1; }
grep -qE "^  warning        : .*tmpfs keeps its files in RAM.*measure memory, not a disk" "$dir/out.txt" ||
  { echo "FAIL: no RAM-backed warning"; exit 1; }
python3 - "$dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["data_dir"]["filesystem"] == "tmpfs" and r["data_dir"]["ram_backed"] is True, r["data_dir"]
PY
echo "tmpfs named and warned about, in the summary and the JSON"
