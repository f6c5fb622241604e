// Controller helpers shared by every implementation.
#include <tutti/libnvm/controller.hpp>
#include <tutti/nvme/status.hpp>

namespace tutti::libnvm {

Status check_completion(const nvme::CompletionQueueEntry& cqe, std::string_view what) {
  if (cqe.status().success()) return Status::success();
  return error(StatusCode::DEVICE_ERROR, "{}: {}", what, nvme::describe_status(cqe.status()));
}

}  // namespace tutti::libnvm
