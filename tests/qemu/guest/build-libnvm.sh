#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the static guest tests of libnvm's SnvmeController, of the local_nvme DataPath over it and of
# the KV block store over that DataPath
# (host profile): build-libnvm.sh REPO_ROOT OUT_DIR.
# {fmt} is used header-only so that the binary needs no shared library in the guest.
set -euo pipefail
root=$1
out=$2
g++ -std=c++20 -O2 -Wall -Wextra -Werror -static -DFMT_HEADER_ONLY -DTUTTI_ACCELERATOR_HOST \
	-I "$root/include" -I "$root/libnvm/include" -I "$root/driver/snvme/include" \
	-o "$out/libnvm-snvme-test" \
	"$root/tests/qemu/guest/libnvm-snvme-test.cpp" \
	"$root/libnvm/snvme/snvme_controller.cpp" \
	"$root/libnvm/src/controller.cpp" \
	-pthread
g++ -std=c++20 -O2 -Wall -Wextra -Werror -static -DFMT_HEADER_ONLY -DTUTTI_ACCELERATOR_HOST \
	-I "$root/include" -I "$root/libnvm/include" -I "$root/driver/snvme/include" \
	-o "$out/local-nvme-snvme-test" \
	"$root/tests/qemu/guest/local-nvme-snvme-test.cpp" \
	"$root/libnvm/snvme/snvme_controller.cpp" \
	"$root/libnvm/src/controller.cpp" \
	-pthread
# Dynamic: Debian ships no static liburiparser; tests/qemu/run.sh copies its shared libraries
# into the initramfs.
g++ -std=c++20 -O2 -Wall -Wextra -Werror -DFMT_HEADER_ONLY -DTUTTI_ACCELERATOR_HOST \
	-I "$root/include" -I "$root/libnvm/include" -I "$root/driver/snvme/include" \
	-o "$out/kv-store-snvme-test" \
	"$root/tests/qemu/guest/kv-store-snvme-test.cpp" \
	"$root/libnvm/snvme/snvme_controller.cpp" \
	"$root/libnvm/src/controller.cpp" \
	-luriparser -llmdb -lxxhash -luring -pthread
