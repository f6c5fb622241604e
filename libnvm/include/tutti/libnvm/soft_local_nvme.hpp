// The soft controller's ready-made local_nvme stack: a SoftController (libnvm's software NVMe
// controller) backed by a file or block device, typically the ext4 image that backs a
// loop-mounted file system, its libnvm driver (brought up), and a LocalNvmeRuntime over them
// (tutti/presets/local_nvme.hpp).
//
//   tutti::SoftLocalNvmeOptions o;
//   o.backing_path = "/tmp/disk.img";        // what the soft controller reads and writes
//   o.block_device_path = "/dev/loop3";      // the block device the file system is mounted from
//   auto stack = tutti::make_soft_local_nvme(o);
//   auto target = stack.value()->runtime->open("file:///mnt/kv/layer17");
//
// CUDA profile: the soft controller is created in accelerator_mode (BAR0 and queues in mapped
// pinned memory, DEVICE memory through map_device), whatever options.soft says.
//
// Part of libnvm (meson: libnvm_dep; installed: `pkg-config --cflags --libs tutti-nvm`).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <tutti/libnvm/controller.hpp>
#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/presets/local_nvme.hpp>

namespace tutti {

/// Settings of make_soft_local_nvme. The LBA size is the soft controller's (soft.lba_size).
struct SoftLocalNvmeOptions {
  /// The soft controller's backing file or block device (soft.backing_path is overwritten by it).
  std::string backing_path;
  /// The block device holding the file system whose files are opened (e.g. the loop device of
  /// backing_path); its st_rdev must be the files' st_dev.
  std::string block_device_path;
  /// Bytes from the start of backing_path to the file system (0 for an image or loop device);
  /// unset: read from sysfs.
  std::optional<std::uint64_t> partition_start_bytes = 0;
  /// How opened files are kept from changing under local_nvme (the resolver's change_protection).
  local_file::ChangeProtection change_protection = local_file::kDefaultChangeProtection;
  libnvm::SoftControllerConfig soft{};  ///< soft controller settings (defaults: libnvm's kSoftDefault*)
  nvme::BringUpOptions bring_up{};      ///< controller bring-up settings
  local_nvme::Options datapath{};
  RuntimeOptions runtime{};
};

/// A soft controller, its libnvm driver and the runtime over them. Members are destroyed in
/// reverse order: the runtime first (it drains IO), then the driver, then the device.
struct SoftLocalNvme {
  std::shared_ptr<libnvm::SoftController> device;  ///< fault injection and counters for tests
  std::unique_ptr<nvme::Controller> controller;
  std::unique_ptr<LocalNvmeRuntime> runtime;
  ~SoftLocalNvme() { runtime.reset(); }
};

/// Creates the soft controller, brings it up, creates the DataPath's queues and the runtime.
/// Errors: those of SoftController::create, bring_up and make_local_nvme_runtime (each with
/// context).
inline Result<std::unique_ptr<SoftLocalNvme>> make_soft_local_nvme(SoftLocalNvmeOptions options) {
  auto stack = std::make_unique<SoftLocalNvme>();
  options.soft.backing_path = options.backing_path;
  // CUDA profile: the DataPath's kernels write SQEs and ring doorbells from the GPU, so BAR0 and
  // the queues must be in mapped pinned memory, and DEVICE registrations need map_device.
  if constexpr (accel::kProfile == accel::Profile::cuda) options.soft.accelerator_mode = true;
  auto device = libnvm::SoftController::create(options.soft);
  if (!device) return device.status().with_context("soft controller");
  stack->device = *device;
  auto controller = libnvm::open_soft_controller(stack->device);
  if (!controller) return controller.status().with_context("soft controller driver");
  stack->controller = std::move(controller.value());
  TUTTI_RETURN_IF_ERROR(stack->controller->bring_up(options.bring_up).with_context("bring_up"));
  local_file::LocalFileResolver::Options resolver;
  resolver.block_device_path = options.block_device_path;
  resolver.partition_start_bytes = options.partition_start_bytes;
  resolver.change_protection = options.change_protection;
  auto runtime = make_local_nvme_runtime(*stack->controller, std::move(resolver), options.datapath, options.runtime);
  if (!runtime) return runtime.status();
  stack->runtime = std::make_unique<LocalNvmeRuntime>(std::move(runtime.value()));
  return Result<std::unique_ptr<SoftLocalNvme>>(std::move(stack));  // explicit: nvcc does not move implicitly here
}

}  // namespace tutti
