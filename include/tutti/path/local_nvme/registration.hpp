// Memory registration of the local_nvme DataPath (register_memory / unregister_memory): the
// DMA mapping of a region for the controller and its PRP lists, prebuilt once so that no submit
// builds a list (DESIGN.md 3: registration happens in register_memory, never lazily in submit).
//
// HOST / PINNED_HOST regions go through nvme::Controller::dma_map, DEVICE regions (CUDA profile;
// a cudaMalloc address) through dma_map_device. The list pages are read by the controller and
// live in a controller DMA buffer (host memory; for a GPU region they hold GPU bus addresses, as
// the Linux NVMe driver's lists do under GPUDirect Storage: a drive reads them from host memory
// and writes the data peer-to-peer). The page tables the kernels read per command (region pages
// and list pages, 8 bytes each) go into accelerator memory (accel::DeviceBuffer: device memory
// in the CUDA profile). Memory per registration: about 0.8 % of the region in list pages
// (host), 0.2 % in page tables (device memory in the CUDA profile), at 4 KiB pages.
// Units: bytes. Thread-safety: a Mapping is immutable once built, except its zombie counter.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/nvme/page_table.hpp>
#include <tutti/path/local_nvme/prp_table.hpp>

namespace tutti::local_nvme {

/// A DMA mapping and its prebuilt PRP lists. Shared by the registration and any zombie command
/// that may still make the controller touch it (zombies.hpp); the last owner unmaps (before the
/// members' memory is freed: the destructor body runs first).
struct Mapping {
  nvme::Controller* controller = nullptr;
  nvme::DmaMapping mapping;
  /// The PRP list pages (both variants): a controller DMA buffer, whatever the region's kind.
  nvme::DmaBuffer lists;
  /// table.pages and table.lists: the bus address of every region page, then of every list
  /// page, in accelerator memory (CUDA profile: device memory; read per command by the kernels).
  accel::DeviceBuffer page_tables;
  PrpTable table;
  std::uintptr_t user_address = 0;  ///< first byte of the user region
  std::uint64_t user_size = 0;
  std::atomic<std::uint32_t> zombies{0};
  ~Mapping() {
    if (controller == nullptr) return;
    if (lists.id != 0) (void)controller->free_dma_buffer(lists.id);
    if (mapping.id != 0) (void)controller->dma_unmap(mapping.id);
  }
};

/// One registration (LocalNvmeDataPath::registered_memory).
struct RegisteredMemory {
  std::shared_ptr<Mapping> mapping;
  /// The registration's PRP table as the kernels read it (prp_table.hpp): page tables in
  /// accelerator memory (CUDA profile: device memory, not dereferenceable on the host). For
  /// inspection (tests, diagnostics); nullptr when this object holds no registration (default
  /// constructed, or after unregister_memory). Thread-safety: as a plain value.
  const PrpTable* prp_table() const noexcept { return mapping ? &mapping->table : nullptr; }
};

/// Allocates and fills the list pages of `m` (a controller DMA buffer) and places the page
/// tables the kernels read (see the file comment). Errors: allocate_dma_buffer's,
/// accel::DeviceBuffer::allocate's RESOURCE_EXHAUSTED, a failed copy into accelerator memory
/// (DEVICE_ERROR); `m`'s destructor releases whatever was set up.
inline Status build_prp_table(Mapping& m) {
  const std::uint32_t page_size = m.mapping.page_size;
  const std::uint64_t region_pages = m.mapping.bus_addresses.size();
  const std::uint64_t list_pages = PrpTable::list_pages_for(region_pages, page_size);
  auto lists = m.controller->allocate_dma_buffer(2 * list_pages * page_size);
  if (!lists) return lists.status().with_context("PRP list buffer");
  m.lists = *lists;
  std::vector<std::uint64_t> list_bus_addresses;
  try {
    list_bus_addresses.resize(2 * list_pages);
  } catch (const std::bad_alloc&) {
    return error(StatusCode::RESOURCE_EXHAUSTED, "no host memory for the bus addresses of {} PRP list pages",
                 2 * list_pages);
  }
  for (std::uint64_t i = 0; i < 2 * list_pages; ++i) list_bus_addresses[i] = m.lists.bus_address + i * page_size;
  // Fill from host copies of both page tables, then move the tables to accelerator memory.
  m.table.pages = nvme::PageTableView{m.mapping.bus_addresses.data(), region_pages, page_size};
  m.table.lists = nvme::PageTableView{list_bus_addresses.data(), 2 * list_pages, page_size};
  m.table.list_pages = list_pages;
  m.table.fill(static_cast<std::uint64_t*>(m.lists.host_address));
  const std::uint64_t table_bytes = (region_pages + 2 * list_pages) * sizeof(std::uint64_t);
  auto tables = accel::DeviceBuffer::allocate(table_bytes);
  if (!tables) return tables.status().with_context("page tables in accelerator memory");
  m.page_tables = std::move(*tables);
  auto* home = static_cast<std::uint64_t*>(m.page_tables.data());
  if (Status copied = accel::copy_to_device(home, m.mapping.bus_addresses.data(), region_pages * sizeof(std::uint64_t));
      !copied)
    return copied.with_context("region page table into accelerator memory");
  if (Status copied =
          accel::copy_to_device(home + region_pages, list_bus_addresses.data(), 2 * list_pages * sizeof(std::uint64_t));
      !copied)
    return copied.with_context("PRP list page table into accelerator memory");
  m.table.pages.bus_addresses = home;
  m.table.lists.bus_addresses = home + region_pages;
  return Status::success();
}

/// DMA-maps the pages that hold `view` for `controller` and prebuilds its PRP lists (see the file
/// comment). Errors: the controller's dma_map / dma_map_device / allocate_dma_buffer errors (e.g.
/// INVALID_ARGUMENT when a page of the region is already mapped by another registration,
/// UNSUPPORTED when the controller cannot map device memory), accel::DeviceBuffer::allocate's
/// RESOURCE_EXHAUSTED, or a failed copy into device memory (DEVICE_ERROR); nothing stays mapped
/// on error. Thread-safety: safe concurrently with other calls on the controller.
inline Result<RegisteredMemory> register_region(nvme::Controller& controller, const MemoryView& view) {
  auto m = std::make_shared<Mapping>();
  const std::uint64_t page = 4096;
  const auto address = reinterpret_cast<std::uintptr_t>(view.address);
  const std::uintptr_t first = address / page * page;
  const std::uint64_t length = (address + view.size - first + page - 1) / page * page;
  const bool device = view.kind == MemoryKind::DEVICE;
  auto mapped = device ? controller.dma_map_device(reinterpret_cast<void*>(first), length)
                       : controller.dma_map(reinterpret_cast<void*>(first), length);
  if (!mapped)
    return mapped.status().with_context(device ? "local_nvme: register_memory: dma_map_device"
                                               : "local_nvme: register_memory: dma_map");
  m->controller = &controller;
  m->mapping = std::move(mapped.value());
  m->user_address = address;
  m->user_size = view.size;
  if (Status built = build_prp_table(*m); !built) return built.with_context("local_nvme: register_memory");
  return RegisteredMemory{std::move(m)};
}

}  // namespace tutti::local_nvme
