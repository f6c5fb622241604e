// The soft controllers' ready-made striped stack: N SoftControllers (libnvm's software NVMe
// controller), each backed by its own file or block device (typically the ext4 image behind a
// loop-mounted file system), their libnvm drivers (brought up), and one runtime over them with
// two backends (tutti/presets/striped_nvme.hpp, StripedMixedRuntime): striped:// targets whose
// shard i lies on device i's file system, and plain file:// targets through one more soft
// controller (local_nvme): SoftStripedNvmeOptions::plain, by default a second controller over
// device 0's backing file and file system. (One controller cannot serve both DataPaths: the
// runtime registers memory with each, and a controller maps a region once.)
//
//   tutti::SoftStripedNvmeOptions o;
//   o.devices = {{"/tmp/d0.img", "/dev/loop3"}, {"/tmp/d1.img", "/dev/loop4"}};
//   auto stack = tutti::make_soft_striped_nvme(o);
//   auto t = stack.value()->runtime->open("striped://kv?devs=/mnt/d0/kv,/mnt/d1/kv&unit=1048576");
//
// CUDA profile: every soft controller is created in accelerator_mode (as make_soft_local_nvme).
// Part of libnvm (meson: libnvm_dep).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tutti/libnvm/controller.hpp>
#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/presets/striped_nvme.hpp>

namespace tutti {

/// One device of the stack: the soft controller's backing file and the block device its file
/// system is mounted from (empty block_device_path: no file:// or shard resolution on it, for
/// null mode).
struct SoftStripedDevice {
  std::string backing_path;
  std::string block_device_path;
  std::optional<std::uint64_t> partition_start_bytes = 0;
  libnvm::SoftControllerConfig soft{};  ///< soft.backing_path is overwritten by backing_path
};

/// Settings of make_soft_striped_nvme. Each device's LBA size is its soft controller's.
struct SoftStripedNvmeOptions {
  std::vector<SoftStripedDevice> devices;  ///< 1 to striped_nvme::kMaxControllers
  /// The controller of plain file:// targets; empty backing_path: device 0's backing file and
  /// block device (a second soft controller over the same file).
  SoftStripedDevice plain{};
  local_file::ChangeProtection change_protection = local_file::kDefaultChangeProtection;
  nvme::BringUpOptions bring_up{};
  local_nvme::Options datapath{};  ///< for the striped DataPath and the plain one alike
  RuntimeOptions runtime{};
};

/// The soft controllers, their drivers and the runtime. The runtime is destroyed first (it
/// drains IO), then the drivers, then the devices.
struct SoftStripedNvme {
  std::vector<std::shared_ptr<libnvm::SoftController>> devices;  ///< fault injection and counters
  std::vector<std::unique_ptr<nvme::Controller>> controllers;
  std::shared_ptr<libnvm::SoftController> plain_device;  ///< the plain file:// targets' controller
  std::unique_ptr<nvme::Controller> plain_controller;
  std::unique_ptr<StripedMixedRuntime> runtime;
  ~SoftStripedNvme() {
    runtime.reset();
    plain_controller.reset();
    controllers.clear();
  }
};

/// Creates the N soft controllers, brings them up and builds the runtime. Errors:
/// INVALID_ARGUMENT (no device, more than striped_nvme::kMaxControllers), and those of
/// SoftController::create, bring_up (with context "device i"), make_striped_nvme_backend,
/// LocalFileResolver::create and LocalNvmeDataPath::create.
inline Result<std::unique_ptr<SoftStripedNvme>> make_soft_striped_nvme(SoftStripedNvmeOptions options) {
  if (options.devices.empty() || options.devices.size() > striped_nvme::kMaxControllers)
    return error(StatusCode::INVALID_ARGUMENT, "soft striped stack: devices = {}; expected 1 to {}",
                 options.devices.size(), striped_nvme::kMaxControllers);
  auto stack = std::make_unique<SoftStripedNvme>();
  striped_file::StripedFileResolver::Options shards;
  std::vector<nvme::Controller*> raw;
  for (std::size_t i = 0; i < options.devices.size(); ++i) {
    SoftStripedDevice& d = options.devices[i];
    d.soft.backing_path = d.backing_path;
    if constexpr (accel::kProfile == accel::Profile::cuda) d.soft.accelerator_mode = true;
    auto device = libnvm::SoftController::create(d.soft);
    if (!device) return device.status().with_context(fmt::format("device {}: soft controller", i));
    stack->devices.push_back(*device);
    auto controller = libnvm::open_soft_controller(stack->devices.back());
    if (!controller) return controller.status().with_context(fmt::format("device {}: soft controller driver", i));
    stack->controllers.push_back(std::move(controller.value()));
    TUTTI_RETURN_IF_ERROR(
        stack->controllers.back()->bring_up(options.bring_up).with_context(fmt::format("device {}: bring_up", i)));
    raw.push_back(stack->controllers.back().get());
    local_file::LocalFileResolver::Options r;
    r.block_device_path = d.block_device_path;
    r.partition_start_bytes = d.partition_start_bytes;
    r.change_protection = options.change_protection;
    shards.shards.push_back(std::move(r));
  }
  auto striped = make_striped_nvme_backend(raw, std::move(shards), options.datapath);
  if (!striped) return striped.status();
  SoftStripedDevice& p = options.plain;
  if (p.backing_path.empty()) {
    p.backing_path = options.devices.front().backing_path;
    p.block_device_path = options.devices.front().block_device_path;
    p.partition_start_bytes = options.devices.front().partition_start_bytes;
    p.soft = options.devices.front().soft;
  }
  p.soft.backing_path = p.backing_path;
  if constexpr (accel::kProfile == accel::Profile::cuda) p.soft.accelerator_mode = true;
  auto device = libnvm::SoftController::create(p.soft);
  if (!device) return device.status().with_context("plain: soft controller");
  stack->plain_device = *device;
  auto controller = libnvm::open_soft_controller(stack->plain_device);
  if (!controller) return controller.status().with_context("plain: soft controller driver");
  stack->plain_controller = std::move(controller.value());
  TUTTI_RETURN_IF_ERROR(stack->plain_controller->bring_up(options.bring_up).with_context("plain: bring_up"));
  local_file::LocalFileResolver::Options plain;
  plain.block_device_path = p.block_device_path;
  plain.partition_start_bytes = p.partition_start_bytes;
  plain.change_protection = options.change_protection;
  plain.lba_size = stack->plain_controller->identity().lba_size;
  plain.nsid = stack->plain_controller->identity().nsid;
  auto resolver = local_file::LocalFileResolver::create(std::move(plain));
  if (!resolver) return resolver.status().with_context("plain: file:// resolver");
  auto local = local_nvme::LocalNvmeDataPath::create(*stack->plain_controller, options.datapath);
  if (!local) return local.status().with_context("plain: local_nvme");
  stack->runtime = std::make_unique<StripedMixedRuntime>(
      std::move(striped.value()), LocalNvmeBackend{std::move(resolver.value()), std::move(local.value())},
      options.runtime);
  return stack;
}

}  // namespace tutti
