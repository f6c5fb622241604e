// Ready-made local-file runtime over one NVMe controller: file:// URIs resolved with FIEMAP
// (local_file::LocalFileResolver) and executed as NVMe commands (local_nvme::LocalNvmeDataPath)
// on queue pairs of any nvme::Controller (tutti/nvme/controller.hpp).
//
//   LocalNvmeBackend  = Backend<local_file::LocalFileResolver, local_nvme::LocalNvmeDataPath>
//   LocalNvmeRuntime  = StorageRuntime<LocalNvmeBackend>
//
// make_local_nvme_runtime() builds the runtime over a controller that is already brought up;
// the controller must outlive the runtime. The soft controller's ready-made stack (device,
// driver and runtime in one object, make_soft_local_nvme) is libnvm's: include
// <tutti/libnvm/soft_local_nvme.hpp> and link libnvm (meson: libnvm_dep; installed:
// `pkg-config --cflags --libs tutti-nvm`) for it. This header needs nothing compiled (installed:
// `pkg-config --cflags --libs tutti`). Not included by presets.hpp or tutti.hpp: include it yourself.
#pragma once

#include <tutti/core/runtime.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/path/local_nvme.hpp>
#include <tutti/resolve/local_file.hpp>

namespace tutti {

/// file:// targets on one NVMe namespace, IO through NVMe queues of one controller.
using LocalNvmeBackend = Backend<local_file::LocalFileResolver, local_nvme::LocalNvmeDataPath>;
using LocalNvmeRuntime = StorageRuntime<LocalNvmeBackend>;

/// The runtime over `controller` (brought up: its identity gives the resolver's LBA size and
/// NSID, which override resolver.lba_size and resolver.nsid). Errors: those of
/// local_file::LocalFileResolver::create and local_nvme::LocalNvmeDataPath::create. The
/// controller must outlive the runtime. Thread-safety: any thread.
inline Result<LocalNvmeRuntime> make_local_nvme_runtime(nvme::Controller& controller,
                                                        local_file::LocalFileResolver::Options resolver,
                                                        local_nvme::Options datapath = {},
                                                        RuntimeOptions runtime = {}) {
  resolver.lba_size = controller.identity().lba_size;
  resolver.nsid = controller.identity().nsid;
  auto resolved = local_file::LocalFileResolver::create(std::move(resolver));
  if (!resolved) return resolved.status();
  auto path = local_nvme::LocalNvmeDataPath::create(controller, datapath);
  if (!path) return path.status();
  return LocalNvmeRuntime(LocalNvmeBackend{std::move(resolved.value()), std::move(path.value())}, runtime);
}

}  // namespace tutti
