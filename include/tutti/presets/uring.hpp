// The uring preset: file:// URIs on any Linux file system, executed by io_uring on the host
// (tutti::file::FileResolver + tutti::uring::UringDataPath). docs/uring.md describes both halves.
//
//   auto runtime = tutti::make_uring_runtime();                       // default Options: queue depth 256
//   auto tuned = tutti::make_uring_runtime({.queue_depth = 1024});     // Result<UringRuntime>
#pragma once

#include <tutti/core/concepts.hpp>
#include <tutti/core/runtime.hpp>
#include <tutti/path/uring.hpp>
#include <tutti/resolve/file.hpp>

namespace tutti {

/// The uring backend: file:// resolution (no FIEMAP) bound to the io_uring DataPath.
using UringBackend = Backend<file::FileResolver, uring::UringDataPath>;
/// A runtime with the uring backend only.
using UringRuntime = StorageRuntime<UringBackend>;

/// A uring runtime: creates the DataPath (its ring) with `options` and the runtime over it.
/// Errors: those of uring::UringDataPath::create (the kernel's refusal of the ring).
/// Thread-safety: any thread.
inline Result<UringRuntime> make_uring_runtime(uring::Options options = {}, RuntimeOptions runtime = {}) {
  auto datapath = uring::UringDataPath::create(options);
  if (!datapath) return datapath.status().with_context("uring DataPath");
  return UringRuntime(UringBackend{file::FileResolver{}, std::move(datapath).value()}, runtime);
}

}  // namespace tutti
