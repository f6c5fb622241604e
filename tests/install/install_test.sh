#!/usr/bin/env bash
# install_test.sh SOURCE_ROOT SCRATCH: what README.md's "Installing" steps promise, done the same way:
# configure the tree with a private prefix, `meson install` it, then build programs with nothing but
# `pkg-config --cflags --libs` and run them, with no LD_LIBRARY_PATH and no -Wl,-rpath of their own:
#   - README.md's "Using it" sample (tests/docs/readme_sample.py) against `tutti`, reading a real file;
#   - a program with LocalNvmeRuntime's preset (<tutti/presets/local_nvme.hpp>) against `tutti` alone;
#   - a program against `tutti-nvm` and `tutti-kv` that brings up libnvm's software NVMe controller (the
#     shared libtutti_nvm is found through the rpath its .pc carries) and names a KV store's layer file
#     (the store's headers, with LMDB and libxxhash from tutti-kv's Requires).
# The prefix lives under SCRATCH (a folder of the build tree: on a disk, so O_DIRECT works).
set -euo pipefail
src=$1 scratch=$2
for tool in meson pkg-config g++; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed"; exit 77; }
done
mkdir -p "$scratch"
work=$(mktemp -d "$scratch/install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
step() { echo "== $*"; }
step "meson setup --prefix=$prefix (libraries and headers only), meson install"
meson setup "$work/build" "$src" --prefix="$prefix" --buildtype=plain -Dtests=false -Dbench=false -Dexamples=false \
  >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
meson install -C "$work/build" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
# The libdir is meson's default for this machine: lib/<multiarch triplet> on Debian (lib/x86_64-linux-gnu).
libdir=$(meson introspect --buildoptions "$work/build" |
         python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "libdir"))')
echo "libdir: $libdir"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
unset LD_LIBRARY_PATH
for package in tutti tutti-nvm tutti-kv; do
  pkg-config --exists "$package" || { ls -R "$prefix/$libdir"; echo "FAIL: pkg-config finds no $package"; exit 1; }
  echo "$package: $(pkg-config --cflags --libs "$package")"
done

step "README.md's sample, built with \$(pkg-config --cflags --libs tutti)"
python3 "$src/tests/docs/readme_sample.py" "$src/README.md" "$work/sample.cpp"
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
g++ -std=c++20 "$work/sample.cpp" -o "$work/sample" $(pkg-config --cflags --libs tutti)
"$work/sample" "$work"

step "LocalNvmeRuntime's header-only preset, built with \$(pkg-config --cflags --libs tutti) alone"
cat >"$work/local_nvme.cpp" <<'CPP'
// <tutti/presets/local_nvme.hpp> is header-only over any nvme::Controller: it builds and links without
// libnvm.
#include <cstdio>
#include <type_traits>

#include <tutti/presets/local_nvme.hpp>

int main() {
  static_assert(std::is_move_constructible_v<tutti::LocalNvmeRuntime>);
  auto* factory = &tutti::make_local_nvme_runtime;
  std::printf("make_local_nvme_runtime linked at %p\n", reinterpret_cast<void*>(factory));
  return factory == nullptr ? 1 : 0;
}
CPP
# shellcheck disable=SC2046
g++ -std=c++20 "$work/local_nvme.cpp" -o "$work/local_nvme" $(pkg-config --cflags --libs tutti)
"$work/local_nvme"

step "a libnvm and KV store program, built with \$(pkg-config --cflags --libs tutti-nvm tutti-kv)"
cat >"$work/nvm.cpp" <<'CPP'
// Brings up the software NVMe controller over a 4 MiB backing file and prints what Identify reported.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <tutti/kv/kv.hpp>
#include <tutti/libnvm/soft_controller.hpp>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string backing = std::string(argv[1]) + "/namespace.img";
  const int fd = ::open(backing.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ::ftruncate(fd, 4 << 20) != 0) return 2;
  ::close(fd);
  tutti::libnvm::SoftControllerConfig config;
  config.backing_path = backing;
  config.lba_size = 4096;
  auto device = tutti::libnvm::SoftController::create(config);
  if (!device) return std::fprintf(stderr, "%s\n", device.status().to_string().c_str()), 1;
  auto controller = tutti::libnvm::open_soft_controller(*device);
  if (!controller) return std::fprintf(stderr, "%s\n", controller.status().to_string().c_str()), 1;
  if (auto s = (*controller)->bring_up({}); !s.is_ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  const auto& id = (*controller)->identity();
  std::printf("soft controller up: namespace %u, %llu LBAs of %u bytes; a KV store's first layer file: %s\n",
              id.nsid, static_cast<unsigned long long>(id.namespace_size_lbas), id.lba_size,
              tutti::kv::Layout::file_name(0).c_str());
  return id.lba_size == 4096 && id.namespace_size_lbas == 1024 ? 0 : 1;
}
CPP
# shellcheck disable=SC2046
g++ -std=c++20 "$work/nvm.cpp" -o "$work/nvm" $(pkg-config --cflags --libs tutti-nvm tutti-kv)
"$work/nvm" "$work"
echo "installed to a private prefix; the three programs built from pkg-config alone and ran"
