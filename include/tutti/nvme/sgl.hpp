// SGL builder: SGL Entry 1 and chained SGL segments (Data Block, Segment, Last Segment
// descriptors) from a registered region's page table.
//
// NVMe Base Specification 2.0, 4.3.2 "Scatter Gather List (SGL)" (Figures 114-120):
//  - SGL Entry 1 in the SQE is either one Data Block descriptor covering the whole transfer, or a
//    Segment / Last Segment descriptor pointing to the first SGL segment.
//  - A segment is an array of 16-byte descriptors. In a Segment, the last descriptor is a Segment
//    or Last Segment descriptor pointing to the next segment; a Last Segment holds data blocks only.
//  - Data blocks here use Subtype Address; bus-contiguous pages are merged into one descriptor.
// Usable from host and device code; allocation-free.
#pragma once

#include <cstdint>

#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/page_table.hpp>

namespace tutti::nvme {

/// Largest Data Block length the builder emits (bytes); longer runs are split.
inline constexpr std::uint32_t kSglMaxDataBlockBytes = 1u << 31;

/// Result of build_sgl.
struct SglBuild {
  StatusCode status = StatusCode::OK;     ///< OK, OUT_OF_RANGE, INVALID_ARGUMENT or RESOURCE_EXHAUSTED
  SglDescriptor sgl1{};                   ///< SGL Entry 1 for the SQE (set PSDT = 01b)
  std::uint32_t data_blocks = 0;          ///< Data Block descriptors describing the transfer
  std::uint32_t descriptors_written = 0;  ///< descriptors written to the segment area
};

/// Calls visit(bus_address, bytes) for each maximal bus-contiguous run of the transfer, split at
/// kSglMaxDataBlockBytes. Precondition: table.contains(offset, length).
template <class Visit>
TUTTI_HOST_DEVICE inline void for_each_bus_run(const PageTableView& table, std::uint64_t offset, std::uint64_t length,
                                               Visit&& visit) noexcept {
  std::uint64_t run_start = table.bus_address_of(offset);
  std::uint64_t run_bytes = 0;
  std::uint64_t position = offset;
  const std::uint64_t end = offset + length;
  while (position < end) {
    const std::uint64_t in_page = table.page_size - position % table.page_size;
    const std::uint64_t chunk = in_page < end - position ? in_page : end - position;
    const std::uint64_t bus = table.bus_address_of(position);
    if (run_bytes != 0 && (bus != run_start + run_bytes || run_bytes + chunk > kSglMaxDataBlockBytes)) {
      visit(run_start, run_bytes);
      run_start = bus;
      run_bytes = 0;
    }
    run_bytes += chunk;
    position += chunk;
  }
  if (run_bytes != 0) visit(run_start, run_bytes);
}

/// Builds SGL Entry 1 for a transfer of `length` bytes at `offset` in the region of `table`,
/// writing segments into `area` when more than one data block is needed. Each segment holds at
/// most `max_descriptors_per_segment` (>= 2) descriptors; 256 keeps a segment in one 4 KiB page.
/// Errors (in SglBuild::status):
///   OUT_OF_RANGE        length == 0 or outside the region;
///   INVALID_ARGUMENT    area not 16-byte aligned, max_descriptors_per_segment < 2, length > 4 GiB - 1;
///   RESOURCE_EXHAUSTED  the area is too small (descriptors_written says how many were needed).
/// Thread-safety: reentrant; `area` must not be shared with a concurrent build.
TUTTI_HOST_DEVICE inline SglBuild build_sgl(const PageTableView& table, std::uint64_t offset, std::uint64_t length,
                                            const DescriptorArea& area,
                                            std::uint32_t max_descriptors_per_segment = 256) noexcept {
  SglBuild out;
  if (!table.contains(offset, length)) {
    out.status = StatusCode::OUT_OF_RANGE;
    return out;
  }
  if (max_descriptors_per_segment < 2 || length > 0xffffffffull) {
    out.status = StatusCode::INVALID_ARGUMENT;
    return out;
  }
  std::uint64_t blocks = 0;
  SglDescriptor only{};
  for_each_bus_run(table, offset, length, [&](std::uint64_t bus, std::uint64_t bytes) {
    if (blocks == 0) only = SglDescriptor::make(SglDescriptorType::data_block, bus, static_cast<std::uint32_t>(bytes));
    ++blocks;
  });
  out.data_blocks = static_cast<std::uint32_t>(blocks);
  if (blocks == 1) {
    out.sgl1 = only;
    return out;
  }
  if (area.bus_address % 16 != 0 || reinterpret_cast<std::uintptr_t>(area.host) % 16 != 0) {
    out.status = StatusCode::INVALID_ARGUMENT;
    return out;
  }
  // Segments: every segment but the last carries (max - 1) data blocks and one pointer.
  const std::uint64_t per = max_descriptors_per_segment;
  std::uint64_t total = blocks;
  if (blocks > per) total = blocks + (blocks - 2) / (per - 1);  // pointers needed
  out.descriptors_written = static_cast<std::uint32_t>(total);
  if (total * sizeof(SglDescriptor) > area.bytes) {
    out.status = StatusCode::RESOURCE_EXHAUSTED;
    return out;
  }
  auto* descriptors = static_cast<SglDescriptor*>(area.host);
  // Segment sizes: the remaining blocks fit in one segment when <= per; otherwise per - 1 + pointer.
  std::uint64_t remaining = blocks;
  std::uint64_t slot = 0;
  std::uint64_t segment_len = remaining <= per ? remaining : per;
  out.sgl1 = SglDescriptor::make(remaining <= per ? SglDescriptorType::last_segment : SglDescriptorType::segment,
                                 area.bus_address, static_cast<std::uint32_t>(segment_len * sizeof(SglDescriptor)));
  std::uint64_t in_segment = 0;
  for_each_bus_run(table, offset, length, [&](std::uint64_t bus, std::uint64_t bytes) {
    const bool segment_needs_pointer = remaining > per - in_segment;  // more blocks than room left
    if (segment_needs_pointer && in_segment == per - 1) {
      // Last slot of a non-final segment: point to the next segment, right after this one.
      const std::uint64_t next_bus = area.bus_address + (slot + 1) * sizeof(SglDescriptor);
      const std::uint64_t next_len = remaining <= per ? remaining : per;
      descriptors[slot++] =
          SglDescriptor::make(remaining <= per ? SglDescriptorType::last_segment : SglDescriptorType::segment, next_bus,
                              static_cast<std::uint32_t>(next_len * sizeof(SglDescriptor)));
      in_segment = 0;
    }
    descriptors[slot++] = SglDescriptor::make(SglDescriptorType::data_block, bus, static_cast<std::uint32_t>(bytes));
    ++in_segment;
    --remaining;
  });
  return out;
}

}  // namespace tutti::nvme
