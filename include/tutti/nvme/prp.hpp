// PRP builder: PRP Entry 1, PRP Entry 2 and PRP lists chained across pages, from a registered
// region's page table.
//
// NVMe Base Specification 2.0, 4.3.1 "Physical Region Page Entry and List" (Figures 108-110):
//  - PRP1 is the bus address of the first byte; bits 1:0 must be zero (dword aligned); it may
//    carry an offset into its memory page.
//  - If the transfer ends inside PRP1's page, PRP2 is unused (0 here).
//  - If it needs exactly one more page, PRP2 is that page's address (offset 0).
//  - Otherwise PRP2 points to a PRP list: 8-byte entries of page addresses with offset 0. The last
//    entry of a list memory page, when more entries remain, is not a data page but the address of
//    the next list page ("chained").
// Usable from host and device code; allocation-free.
#pragma once

#include <cstdint>

#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/page_table.hpp>

namespace tutti::nvme {

/// Result of build_prp. On status != OK nothing useful is in prp1/prp2.
struct PrpBuild {
  StatusCode status = StatusCode::OK;  ///< OK, OUT_OF_RANGE, INVALID_ARGUMENT or RESOURCE_EXHAUSTED
  std::uint64_t prp1 = 0;              ///< PRP Entry 1
  std::uint64_t prp2 = 0;              ///< PRP Entry 2 (0, a page address, or a PRP list address)
  std::uint32_t list_entries = 0;      ///< 8-byte entries written to the list area (data + chain)
};

/// Number of memory pages (page_size bytes) touched by [offset, offset + length), length >= 1.
TUTTI_HOST_DEVICE constexpr std::uint64_t pages_spanned(std::uint64_t offset, std::uint64_t length,
                                                        std::uint32_t page_size) noexcept {
  return (offset % page_size + length + page_size - 1) / page_size;
}

/// PRP list entries (data entries plus chain entries) a transfer needs when the list starts at a
/// list-area address with `list_page_offset` bytes into its memory page (8-byte aligned).
TUTTI_HOST_DEVICE constexpr std::uint64_t prp_list_entries_needed(std::uint64_t offset, std::uint64_t length,
                                                                  std::uint32_t page_size,
                                                                  std::uint64_t list_page_offset = 0) noexcept {
  const std::uint64_t pages = pages_spanned(offset, length, page_size);
  if (pages <= 2) return 0;
  std::uint64_t data = pages - 1;  // PRP1 covers the first page
  std::uint64_t entries = 0;
  std::uint64_t slots_left_in_page = (page_size - list_page_offset % page_size) / 8;
  while (data > 0) {
    if (data <= slots_left_in_page) return entries + data;
    entries += slots_left_in_page;  // slots_left - 1 data entries + 1 chain entry
    data -= slots_left_in_page - 1;
    slots_left_in_page = page_size / 8;
  }
  return entries;
}
static_assert(prp_list_entries_needed(0, 4096, 4096) == 0);
static_assert(prp_list_entries_needed(0, 8192, 4096) == 0);
static_assert(prp_list_entries_needed(0, 12288, 4096) == 2);
static_assert(prp_list_entries_needed(0, 513 * 4096, 4096) == 512);      // exactly one full list page
static_assert(prp_list_entries_needed(0, 514 * 4096, 4096) == 512 + 2);  // 511 data + chain, then 2

/// Builds the data pointer of a transfer of `length` bytes starting `offset` bytes into the
/// region described by `table`, writing a PRP list into `list` when one is needed.
/// Errors (returned in PrpBuild::status, never thrown):
///   OUT_OF_RANGE        length == 0 or [offset, offset + length) not inside the region;
///   INVALID_ARGUMENT    offset not dword (4-byte) aligned, a page table entry not page aligned,
///                       or the list area not 8-byte aligned;
///   RESOURCE_EXHAUSTED  the list area is too small (list_entries says how many were needed).
/// Thread-safety: reentrant; `list` must not be shared with a concurrent build.
TUTTI_HOST_DEVICE inline PrpBuild build_prp(const PageTableView& table, std::uint64_t offset, std::uint64_t length,
                                            const DescriptorArea& list) noexcept {
  PrpBuild out;
  const std::uint64_t page = table.page_size;
  if (!table.contains(offset, length)) {
    out.status = StatusCode::OUT_OF_RANGE;
    return out;
  }
  if (offset % 4 != 0 || page < 4096 || (page & (page - 1)) != 0) {
    out.status = StatusCode::INVALID_ARGUMENT;
    return out;
  }
  const std::uint64_t first_page = offset / page;
  const std::uint64_t pages = pages_spanned(offset, length, table.page_size);
  for (std::uint64_t i = 0; i < pages; ++i)
    if (table.bus_addresses[first_page + i] % page != 0) {
      out.status = StatusCode::INVALID_ARGUMENT;
      return out;
    }
  out.prp1 = table.bus_addresses[first_page] + offset % page;
  if (pages == 1) return out;
  if (pages == 2) {
    out.prp2 = table.bus_addresses[first_page + 1];
    return out;
  }
  if (list.bus_address % 8 != 0 || reinterpret_cast<std::uintptr_t>(list.host) % 8 != 0) {
    out.status = StatusCode::INVALID_ARGUMENT;
    return out;
  }
  const std::uint64_t needed = prp_list_entries_needed(offset, length, table.page_size, list.bus_address % page);
  out.list_entries = static_cast<std::uint32_t>(needed);
  if (needed * 8 > list.bytes) {
    out.status = StatusCode::RESOURCE_EXHAUSTED;
    return out;
  }
  auto* entries = static_cast<std::uint64_t*>(list.host);
  std::uint64_t slot = 0;
  std::uint64_t data_left = pages - 1;
  std::uint64_t next_page = first_page + 1;
  while (data_left > 0) {
    const std::uint64_t slot_bus = list.bus_address + slot * 8;
    const bool last_slot_of_page = slot_bus % page == page - 8;
    if (last_slot_of_page && data_left > 1) {
      entries[slot] = slot_bus + 8;  // chain: the next list page starts right after (area is bus-contiguous)
    } else {
      entries[slot] = table.bus_addresses[next_page++];
      --data_left;
    }
    ++slot;
  }
  out.prp2 = list.bus_address;
  return out;
}

}  // namespace tutti::nvme
