// Ready-made typed runtimes. Each is a StorageRuntime instantiated with the backends a common
// deployment needs; applications may as well spell their own.
//
//   MemfsRuntime      memfs:// targets in host memory (sample backend, tests, examples)
//   UringRuntime      file:// on any file system through io_uring and O_DIRECT
//
// LocalNvmeRuntime (file:// resolved with FIEMAP to LBAs, IO through NVMe queues of an nvme::Controller):
// include <tutti/presets/local_nvme.hpp>; the soft controller's ready-made stack is libnvm's
// (<tutti/libnvm/soft_local_nvme.hpp>, link libnvm: meson libnvm_dep; installed: pkg-config tutti-nvm).
#pragma once

#include <tutti/core/runtime.hpp>
#include <tutti/path/memfs.hpp>
#include <tutti/resolve/memfs.hpp>

namespace tutti {

/// memfs:// targets in host memory: the sample backend, for tests and examples.
using MemfsBackend = Backend<memfs::MemfsResolver, memfs::MemfsDataPath>;
using MemfsRuntime = StorageRuntime<MemfsBackend>;

/// A memfs runtime over a fresh store (or `resolver`'s, to share files between runtimes).
/// Errors: those of memfs::MemfsDataPath::create. Thread-safety: any thread.
inline Result<MemfsRuntime> make_memfs_runtime(memfs::MemfsDataPath::Options options = {}, RuntimeOptions runtime = {},
                                               memfs::MemfsResolver resolver = {}) {
  auto datapath = memfs::MemfsDataPath::create(options);
  if (!datapath) return datapath.status().with_context("memfs DataPath");
  return MemfsRuntime(MemfsBackend{std::move(resolver), std::move(datapath).value()}, runtime);
}

}  // namespace tutti

#include <tutti/presets/uring.hpp>
