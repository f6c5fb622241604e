#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds tuttid, tuttictl and the guest client of tuttid on a PCI controller (tuttid-snvme-test), static
# (host profile; {fmt} header-only, nlohmann/json and CLI11 are header-only): build-tuttid.sh REPO_ROOT OUT_DIR.
# Each source is compiled once; the three programs share the objects.
set -euo pipefail
root=$1
out=$2
obj=$(mktemp -d)  # not under OUT_DIR: the rig installs everything there into the guest
trap 'rm -rf "$obj"' EXIT
flags=(-std=c++20 -O2 -Wall -Wextra -Werror -DFMT_HEADER_ONLY -DTUTTI_ACCELERATOR_HOST
	-I "$root/include" -I "$root/libnvm/include" -I "$root/libnvm/snvme" -I "$root/libnvm/src"
	-I "$root/driver/snvme/include" -I "$root/daemon/src")
sources=(daemon/src/config.cpp daemon/src/protocol.cpp daemon/src/client.cpp daemon/src/controllers.cpp
	daemon/src/server.cpp daemon/src/leased_controller.cpp daemon/src/mounts.cpp daemon/src/pci_controller.cpp
	libnvm/src/controller.cpp libnvm/src/register_controller.cpp libnvm/src/soft_controller.cpp
	libnvm/src/soft_dma.cpp libnvm/snvme/snvme_controller.cpp)
objects=()
for s in "${sources[@]}"; do
	o=$obj/$(echo "$s" | tr / _).o
	g++ "${flags[@]}" -c -o "$o" "$root/$s" &
	objects+=("$o")
	# two at a time (2-core CI machines); a failed compile stops the script here
	if (($(jobs -r | wc -l) >= 2)); then wait -n; fi
done
for job in $(jobs -p); do wait "$job"; done
for main in daemon/src/tuttid.cpp daemon/src/tuttictl.cpp tests/qemu/guest/tuttid-snvme-test.cpp; do
	name=$(basename "$main" .cpp)
	g++ "${flags[@]}" -static -o "$out/$name" "$root/$main" "${objects[@]}" -pthread
done
