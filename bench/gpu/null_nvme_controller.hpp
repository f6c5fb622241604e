// Benchmark support (not library code): the null controller of tests/support/null_controller.hpp
// behind the nvme::Controller interface, so the product's own DataPath (local_nvme) runs against
// it through the public runtime API, and a resolver of synthetic targets on its namespace.
//
//   NullNvmeController   a test::AgentNvmeController (tests/support/agent_nvme_controller.hpp): the
//                        SQ, CQ, doorbells, CSTS and the null controller's per-queue state in
//                        "agent memory": device memory in the cuda profile (the persistent GPU
//                        kernel services them), host memory in the host profile (host threads
//                        service them); null_agent.hpp starts and stops that service. dma_map /
//                        allocate_dma_buffer hand out bus addresses no device ever uses (no data
//                        moves), PRP list buffers in host memory. Admin commands complete at once
//                        with success; Abort finds nothing.
//   NullNamespaceResolver  "null://NAME?bytes=N": one extent of N bytes (a multiple of 4096) at
//                        LBA 0 of namespace 1, no file behind it.
//
// What it measures: the cost of the submission path itself (no data, a completion per command as
// fast as the servicing agent can post it). Errors and thread-safety: AgentNvmeController's.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/nvme/registers.hpp>

#include "agent_nvme_controller.hpp"  // tests/support
#include "null_controller.hpp"        // tests/support

namespace tutti::bench::gpu {

/// The null controller behind nvme::Controller (see the file comment): AgentNvmeController's
/// queues and tables, bus addresses from a range no device ever uses, DMA buffers in host memory.
class NullNvmeController final : public test::AgentNvmeController {
 public:
  static constexpr std::uint64_t kNamespaceLbas = std::uint64_t{1} << 32;  // 16 TiB of 4 KiB LBAs

  NullNvmeController() : AgentNvmeController("null controller") {}

  std::string_view kind() const noexcept override { return "null"; }

  Status bring_up(const nvme::BringUpOptions& options) override {
    set_identity(options.nsid, kNamespaceLbas, "null controller (benchmark)");
    return Status::success();
  }

  /// The null controller's view of queue pair `qid` (for the servicing agent), or an empty view.
  test::NullControllerQueue controller_view(std::uint16_t qid) const {
    std::scoped_lock lock(mutex_);
    const auto found = queues_.find(qid);
    if (found == queues_.end()) return test::NullControllerQueue{};
    return queue_view<test::NullControllerQueue>(qid, found->second);
  }

 private:
  Status initialise_queue_state(void* state) override {
    test::NullControllerState initial{};
    initial.drop_command = test::kNoDrop;
    return accel::copy_to_device(state, &initial, sizeof(initial));
  }
  /// A fresh range of bus addresses (never used by any device: nothing moves data here).
  std::uint64_t bus_address(void*, std::size_t bytes) override {
    const std::uint64_t at = next_bus_;
    next_bus_ += (bytes + 4095) / 4096 * 4096 + 4096;
    return at;
  }
  Result<test::AgentBuffer> dma_buffer_memory(std::size_t bytes) override { return test::AgentBuffer::host(bytes); }

  std::uint64_t next_bus_ = std::uint64_t{1} << 40;
};

/// Resolves "null://NAME?bytes=N" (N a positive multiple of 4096) to one extent of N bytes at
/// device offset 0 of namespace 1, 4096-byte LBAs, no file (for NullNvmeController).
struct NullNamespaceResolver {
  using target_type = local_file::Target;
  static constexpr std::string_view scheme = "null";
  Result<local_file::Target> resolve(std::string_view uri, const OpenOptions& options) const {
    constexpr std::string_view prefix = "null://";
    const std::size_t query = uri.find("?bytes=");
    std::uint64_t bytes = 0;
    const char* first = query == std::string_view::npos ? nullptr : uri.data() + query + 7;
    const auto [end, ec] = first ? std::from_chars(first, uri.data() + uri.size(), bytes) : std::from_chars_result{};
    if (uri.substr(0, prefix.size()) != prefix || first == nullptr || ec != std::errc{} ||
        end != uri.data() + uri.size() || bytes == 0 || bytes % 4096 != 0)
      return error(StatusCode::INVALID_ARGUMENT, "'{}': expected null://NAME?bytes=N, N a positive multiple of 4096",
                   uri);
    local_file::Target t;
    t.path = std::string(uri);
    t.extents = {local_file::Extent{0, 0, bytes}};
    t.file_size = bytes;
    t.lba_size = 4096;
    t.nsid = 1;
    t.writable = options.writable;
    return t;
  }
};
static_assert(Resolver<NullNamespaceResolver>);

}  // namespace tutti::bench::gpu
