// A Controller implemented as an NVMe host driver over controller registers: bring-up through
// CC/CSTS/AQA/ASQ/ACQ, the admin queue driven with tutti/nvme/queue.hpp, Identify, Set Features,
// Create/Delete I/O queues, Abort. What varies between devices (where BAR0 is, how memory is
// DMA-mapped) is a RegisterTransport. The soft controller uses it; a backend that reaches a real
// controller's BAR and DMA mapping (e.g. through a driver's mmap and ioctls) can reuse it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <tutti/core/status.hpp>
#include <tutti/libnvm/controller.hpp>

namespace tutti::libnvm {

/// Access to one controller's BAR0 and DMA mapping. Thread-safety: all functions may be called
/// concurrently.
class RegisterTransport {
 public:
  virtual ~RegisterTransport() = default;
  /// Implementation name reported by Controller::kind().
  virtual std::string_view kind() const noexcept = 0;
  /// BAR0: registers at offset 0, doorbells from offset 1000h (NVMe PCIe Transport 1.0, 3.1.2).
  virtual volatile std::uint32_t* bar0() noexcept = 0;
  /// Bytes of BAR0 that may be accessed (limits the number of queue doorbells).
  virtual std::size_t bar0_size() const noexcept = 0;
  /// As Controller::dma_map / dma_unmap / allocate_dma_buffer / free_dma_buffer.
  virtual Result<DmaMapping> dma_map(void* host_address, std::size_t length) = 0;
  virtual Status dma_unmap(std::uint64_t mapping_id) = 0;
  virtual Result<DmaBuffer> allocate_dma_buffer(std::size_t length) = 0;
  virtual Status free_dma_buffer(std::uint64_t id) = 0;
  /// As Controller::dma_map_device; the default returns UNSUPPORTED (the transport cannot reach
  /// accelerator memory).
  virtual Result<DmaMapping> dma_map_device(void* device_address, std::size_t length) {
    return error(StatusCode::UNSUPPORTED,
                 "dma_map_device({}, {} bytes): the {} transport cannot DMA-map accelerator memory", device_address,
                 length, kind());
  }
};

/// The register-level driver over `transport` (not yet brought up). Destroying it disables the
/// controller (CC.EN = 0, bounded wait) and frees its queue memory only when the transport
/// confirms the device no longer uses it.
std::unique_ptr<Controller> make_register_controller(std::unique_ptr<RegisterTransport> transport);

}  // namespace tutti::libnvm
