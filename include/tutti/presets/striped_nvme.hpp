// Ready-made striped runtimes over N NVMe controllers: striped:// URIs resolved shard by shard
// with FIEMAP (striped_file::StripedFileResolver) and executed as NVMe commands on every
// controller with one launch per submit (striped_nvme::StripedNvmeDataPath).
//
//   StripedNvmeBackend = Backend<striped_file::StripedFileResolver, striped_nvme::StripedNvmeDataPath>
//   StripedNvmeRuntime = StorageRuntime<StripedNvmeBackend>
//   StripedMixedRuntime = StorageRuntime<StripedNvmeBackend, LocalNvmeBackend>: striped:// targets
//     over every controller and plain file:// targets on controller 0 (its own queue pairs), in
//     the same batches (one launch per DataPath per submit).
//
// The controllers must be brought up and outlive the runtime. The soft controllers' ready-made
// stack is libnvm's <tutti/libnvm/soft_striped_nvme.hpp>. Not included by presets.hpp or
// tutti.hpp: include it yourself.
#pragma once

#include <span>
#include <utility>

#include <tutti/core/runtime.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/path/striped_nvme.hpp>
#include <tutti/presets/local_nvme.hpp>
#include <tutti/resolve/striped_file.hpp>

namespace tutti {

using StripedNvmeBackend = Backend<striped_file::StripedFileResolver, striped_nvme::StripedNvmeDataPath>;
using StripedNvmeRuntime = StorageRuntime<StripedNvmeBackend>;
using StripedMixedRuntime = StorageRuntime<StripedNvmeBackend, LocalNvmeBackend>;

/// The striped backend over `controllers` (shard i of every target on controllers[i]): each
/// shard resolver's LBA size and NSID are set from its controller's identity. Errors:
/// INVALID_ARGUMENT when resolver.shards does not list one entry per controller, those of
/// StripedFileResolver::create and StripedNvmeDataPath::create. Thread-safety: any thread.
inline Result<StripedNvmeBackend> make_striped_nvme_backend(std::span<nvme::Controller* const> controllers,
                                                            striped_file::StripedFileResolver::Options resolver,
                                                            local_nvme::Options datapath = {}) {
  if (resolver.shards.size() != controllers.size())
    return error(StatusCode::INVALID_ARGUMENT,
                 "striped: resolver.shards lists {} block devices but {} controllers are given (one each)",
                 resolver.shards.size(), controllers.size());
  for (std::size_t i = 0; i < controllers.size(); ++i) {
    if (controllers[i] == nullptr) return error(StatusCode::INVALID_ARGUMENT, "striped: controllers[{}] is null", i);
    resolver.shards[i].lba_size = controllers[i]->identity().lba_size;
    resolver.shards[i].nsid = controllers[i]->identity().nsid;
  }
  auto resolved = striped_file::StripedFileResolver::create(std::move(resolver));
  if (!resolved) return resolved.status();
  auto path = striped_nvme::StripedNvmeDataPath::create(controllers, datapath);
  if (!path) return path.status();
  return StripedNvmeBackend{std::move(resolved.value()), std::move(path.value())};
}

/// StripedNvmeRuntime over `controllers`. Errors: make_striped_nvme_backend's.
inline Result<StripedNvmeRuntime> make_striped_nvme_runtime(std::span<nvme::Controller* const> controllers,
                                                            striped_file::StripedFileResolver::Options resolver,
                                                            local_nvme::Options datapath = {},
                                                            RuntimeOptions runtime = {}) {
  auto backend = make_striped_nvme_backend(controllers, std::move(resolver), datapath);
  if (!backend) return backend.status();
  return StripedNvmeRuntime(std::move(backend.value()), runtime);
}

}  // namespace tutti
