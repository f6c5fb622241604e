#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds tuttid, tuttictl, the guest client of tuttid on a PCI controller (tuttid-snvme-test), static, and the
# KV example layerwise_kv_overlap as tuttid's client (--backend nvme) (host profile; {fmt} header-only,
# nlohmann/json and CLI11 are header-only): build-tuttid.sh REPO_ROOT OUT_DIR.
# Each source is compiled once; the four programs share the objects. The example is linked dynamically: Debian
# ships no static liburiparser; tests/qemu/run.sh copies its shared libraries into the initramfs.
set -euo pipefail
root=$1
out=$2
obj=$(mktemp -d)  # not under OUT_DIR: the rig installs everything there into the guest
trap 'rm -rf "$obj"' EXIT
flags=(-std=c++20 -O2 -Wall -Wextra -Werror -DFMT_HEADER_ONLY -DTUTTI_ACCELERATOR_HOST
	-I "$root/include" -I "$root/libnvm/include" -I "$root/libnvm/snvme" -I "$root/libnvm/src"
	-I "$root/driver/snvme/include" -I "$root/daemon/src")
# The example's model shapes header, made as examples/meson.build's configure_file makes it: the template with
# @MODEL_SHAPES_JSON@ replaced by data/model_shapes.json as it is (read -d '': every byte, trailing newline too).
template='' shapes=''
IFS= read -r -d '' template <"$root/examples/layerwise_kv_overlap/model_shapes_json.hpp.in" || true
IFS= read -r -d '' shapes <"$root/data/model_shapes.json" || true
[[ $template == *@MODEL_SHAPES_JSON@* ]] || { echo "no @MODEL_SHAPES_JSON@ in model_shapes_json.hpp.in" >&2; exit 1; }
printf '%s' "${template%%@MODEL_SHAPES_JSON@*}" "$shapes" "${template#*@MODEL_SHAPES_JSON@}" \
	>"$obj/model_shapes_json.hpp"
# The example first (the longest compile), with what examples/meson.build gives it: -DLAYERWISE_TUTTID=1 (the
# nvme backend), the generated header's folder and bench/support (cli_checks.hpp).
g++ "${flags[@]}" -DLAYERWISE_TUTTID=1 -I "$obj" -I "$root/bench/support" -c -o "$obj/layerwise_kv_overlap.o" \
	"$root/examples/layerwise_kv_overlap/main.cpp" &
sources=(daemon/src/config.cpp daemon/src/protocol.cpp daemon/src/client.cpp daemon/src/controllers.cpp
	daemon/src/server.cpp daemon/src/leased_controller.cpp daemon/src/mounts.cpp daemon/src/pci_controller.cpp
	libnvm/src/controller.cpp libnvm/src/register_controller.cpp libnvm/src/soft_controller.cpp
	libnvm/src/soft_dma.cpp libnvm/snvme/snvme_controller.cpp)
objects=()
for s in "${sources[@]}"; do
	# two at a time (2-core CI machines); a failed compile stops the script here
	if (($(jobs -r | wc -l) >= 2)); then wait -n; fi
	o=$obj/$(echo "$s" | tr / _).o
	g++ "${flags[@]}" -c -o "$o" "$root/$s" &
	objects+=("$o")
done
for job in $(jobs -p); do wait "$job"; done
for main in daemon/src/tuttid.cpp daemon/src/tuttictl.cpp tests/qemu/guest/tuttid-snvme-test.cpp; do
	name=$(basename "$main" .cpp)
	g++ "${flags[@]}" -static -o "$out/$name" "$root/$main" "${objects[@]}" -pthread
done
g++ -o "$out/layerwise_kv_overlap" "$obj/layerwise_kv_overlap.o" "${objects[@]}" -luriparser -lxxhash -luring -pthread
