// Prebuilt PRP lists for a registered region, so a command's data pointer is found by table
// lookup (no list building in submit).
//
// NVMe Base Spec 2.0, 4.3.1 "Physical Region Page Entry and List": PRP1 carries the first page
// (with an offset); PRP2 is the second page, or points to a PRP list whose entries are page
// addresses; the last entry of a list memory page, when more entries remain, chains to the next
// list page. The pointer in PRP2 may start anywhere (qword aligned) inside a list page.
//
// Layout. For a region of N memory pages (page size P, E = P / 8 entries per list page), a
// list variant with shift s is a chain of list pages: list page m holds, in slots 0..E-2, the bus
// addresses of region pages j = m * (E - 1) + slot - s, and in slot E-1 the bus address of list
// page m + 1. A command over pages [p, p + k), k >= 3, uses PRP2 = address of page p + 1's slot:
// the controller then walks exactly the pages p + 1 .. p + k - 1, following chains.
// One case fails: the last entry would sit in slot 0 of a list page that the walk entered by a
// chain, so the controller would meet the chain slot E-1 with exactly one entry left and read it
// as data. That happens for page e when (e + s) % (E - 1) == 0; two variants with shifts 0 and
// (E - 1) / 2 never fail on the same e, so lookup picks the variant that works. Memory: two
// lists of about N * 8 * E / (E - 1) bytes each (0.4% of the region per variant at P = 4096).
// List pages need not be contiguous in bus space (an IOMMU may scatter a mapping's pages): the
// table keeps the bus address of every list page (`lists`), and chains and PRP2 come from it.
//
// Placement (path/local_nvme.hpp, register_memory): both page tables, `pages` and `lists`, are
// what the submitting threads read per command, so they live in accelerator memory (CUDA
// profile: device memory, no PCIe round trip per lookup); the list pages themselves are read by
// the controller and live in a controller DMA buffer (host memory, also for a GPU region).
// Host and device code; allocation-free lookup.
#pragma once

#include <cstdint>

#include <tutti/accel/config.hpp>
#include <tutti/nvme/page_table.hpp>
#include <tutti/nvme/prp.hpp>

namespace tutti::local_nvme {

/// A registered region as the submission code sees it: the region's page table and the page
/// table of its two prebuilt list variants, both in memory the submitting threads can read
/// (device memory in the CUDA profile). Trivially copyable.
struct PrpTable {
  nvme::PageTableView pages;  ///< bus address of each memory page of the mapping
  /// Bus address of each list page: variant v's list page m is entry v * list_pages + m
  /// (2 * list_pages entries, same page size as `pages`).
  nvme::PageTableView lists;
  std::uint64_t list_pages = 0;  ///< list pages per variant

  /// Shift of variant v (0 or 1), in entries.
  TUTTI_HOST_DEVICE constexpr std::uint64_t shift(unsigned v) const noexcept {
    return v == 0 ? 0 : (pages.page_size / 8 - 1) / 2;
  }
  /// List pages a variant needs for a region of `page_count` pages of `page_size` bytes.
  TUTTI_HOST_DEVICE static constexpr std::uint64_t list_pages_for(std::uint64_t page_count,
                                                                  std::uint32_t page_size) noexcept {
    const std::uint64_t data_per_page = page_size / 8 - 1;
    return (page_count + (page_size / 8 - 1) / 2) / data_per_page + 1;
  }
  /// Fills both variants' list pages into `list` (host memory, 2 * list_pages * page_size bytes:
  /// variant v's page m at byte (v * list_pages + m) * page_size), whose pages the controller
  /// finds at lists.bus_addresses. `pages` and `lists` must be readable by the calling (host)
  /// thread. Called once at registration, on the list buffer itself (a controller DMA buffer).
  void fill(std::uint64_t* list) const noexcept {
    const std::uint64_t per_page = pages.page_size / 8;
    for (unsigned v = 0; v < 2; ++v) {
      for (std::uint64_t m = 0; m < list_pages; ++m) {
        std::uint64_t* page = list + (v * list_pages + m) * per_page;
        for (std::uint64_t slot = 0; slot + 1 < per_page; ++slot) {
          const std::uint64_t virtual_index = m * (per_page - 1) + slot;
          const std::uint64_t s = shift(v);
          const bool valid = virtual_index >= s && virtual_index - s < pages.page_count;
          page[slot] = valid ? pages.bus_addresses[virtual_index - s] : 0;
        }
        page[per_page - 1] = m + 1 < list_pages ? lists.bus_addresses[v * list_pages + m + 1] : 0;  // chain entry
      }
    }
  }

  /// PRP1 and PRP2 for `length` bytes (>= 1) at byte `offset` of the mapping. Errors (in the
  /// result's status): OUT_OF_RANGE outside the mapping, INVALID_ARGUMENT when offset is not
  /// dword aligned (PRP1 bits 1:0 must be 0).
  TUTTI_HOST_DEVICE nvme::PrpBuild lookup(std::uint64_t offset, std::uint64_t length) const noexcept {
    nvme::PrpBuild out;
    if (!pages.contains(offset, length)) {
      out.status = StatusCode::OUT_OF_RANGE;
      return out;
    }
    if (offset % 4 != 0) {
      out.status = StatusCode::INVALID_ARGUMENT;
      return out;
    }
    const std::uint64_t page_size = pages.page_size;
    const std::uint64_t first = offset / page_size;
    const std::uint64_t count = nvme::pages_spanned(offset, length, pages.page_size);
    out.prp1 = pages.bus_addresses[first] + offset % page_size;
    if (count == 1) return out;
    if (count == 2) {
      out.prp2 = pages.bus_addresses[first + 1];
      return out;
    }
    const std::uint64_t data_per_page = page_size / 8 - 1;
    const std::uint64_t last = first + count - 1;
    const unsigned v = (last + shift(0)) % data_per_page == 0 ? 1u : 0u;
    const std::uint64_t index = first + 1 + shift(v);
    out.prp2 = lists.bus_addresses[v * list_pages + index / data_per_page] + (index % data_per_page) * 8;
    out.list_entries = 0;  // nothing written: the list is prebuilt
    return out;
  }
};

}  // namespace tutti::local_nvme
