// libnvm's side of the Controller abstraction. The abstract nvme::Controller and the types it
// speaks (BringUpOptions, ControllerIdentity, DmaMapping, DmaBuffer, QueuePairInfo) are in the
// header-only tree, tutti/nvme/controller.hpp; libnvm implements them (the soft controller and
// the register-level driver in src/, the snvme backend in snvme/) and, for its own code and its
// users, declares them in tutti::libnvm as well (the same entities, not copies).
// Thread-safety and errors: as tutti/nvme/controller.hpp.
#pragma once

#include <string_view>

#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/controller.hpp>

namespace tutti::libnvm {

using nvme::BringUpOptions;
using nvme::Controller;
using nvme::ControllerIdentity;
using nvme::DmaBuffer;
using nvme::DmaMapping;
using nvme::DmaMemoryKind;
using nvme::QueuePairInfo;

/// DEVICE_ERROR with "<what>: <decoded NVMe status>" unless the CQE reports success.
Status check_completion(const nvme::CompletionQueueEntry& cqe, std::string_view what);

}  // namespace tutti::libnvm
