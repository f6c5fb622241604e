// The uring preset: file:// URIs on any Linux file system, executed by io_uring on the host
// (tutti::file::Resolver + tutti::uring::DataPath). docs/uring.md describes both halves.
//
//   tutti::UringRuntime runtime;                 // default Options: queue depth 256, no SQPOLL
//   tutti::UringRuntime tuned(tutti::UringBackend{{}, tutti::uring::DataPath({.queue_depth = 1024})});
#pragma once

#include <tutti/core/concepts.hpp>
#include <tutti/core/runtime.hpp>
#include <tutti/path/uring.hpp>
#include <tutti/resolve/file.hpp>

namespace tutti {

/// The uring backend: file:// resolution (no FIEMAP) bound to the io_uring DataPath.
using UringBackend = Backend<file::Resolver, uring::DataPath>;
/// A runtime with the uring backend only.
using UringRuntime = StorageRuntime<UringBackend>;

}  // namespace tutti
