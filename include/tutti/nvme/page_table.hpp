// The page table of a DMA-mapped (registered) memory region: one bus address per memory page.
// The input of the PRP and SGL builders; produced by libnvm's Controller::dma_map.
#pragma once

#include <cstdint>

#include <tutti/accel/config.hpp>

namespace tutti::nvme {

/// A non-owning view of a registered region's page table.
/// - `bus_addresses[i]` is the bus address the device uses for bytes [i * page_size,
///   (i + 1) * page_size) of the region; each is page_size aligned. Pages need not be contiguous
///   in bus space (an IOMMU may scatter them).
/// - `page_size`: the controller memory page size in bytes (CC.MPS, 2^(12+MPS)), a power of two >= 4096.
/// - `page_count`: pages in the region; the region is page_count * page_size bytes long.
/// Trivially copyable: pass it to device code by value; the array must be readable there.
struct PageTableView {
  const std::uint64_t* bus_addresses = nullptr;
  std::uint64_t page_count = 0;
  std::uint32_t page_size = 4096;

  /// Region length in bytes.
  TUTTI_HOST_DEVICE constexpr std::uint64_t length() const noexcept { return page_count * page_size; }
  /// True when [offset, offset + length) lies inside the region (overflow-safe), length >= 1.
  TUTTI_HOST_DEVICE constexpr bool contains(std::uint64_t offset, std::uint64_t bytes) const noexcept {
    return bytes != 0 && offset < this->length() && bytes <= this->length() - offset;
  }
  /// Bus address of byte `offset` of the region. Precondition: offset < length().
  TUTTI_HOST_DEVICE constexpr std::uint64_t bus_address_of(std::uint64_t offset) const noexcept {
    return bus_addresses[offset / page_size] + (offset % page_size);
  }
};

/// A DMA-able scratch area the builders write PRP lists or SGL segments into: `host` is where
/// this thread writes, `bus_address` is where the controller reads the same bytes. Contiguous in
/// both spaces, `bytes` long; for PRP lists `host` and `bus_address` must be 8-byte aligned, for
/// SGL segments 16-byte aligned.
struct DescriptorArea {
  void* host = nullptr;
  std::uint64_t bus_address = 0;
  std::uint64_t bytes = 0;
};

}  // namespace tutti::nvme
