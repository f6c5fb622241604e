// PRP and SGL builders: exact layouts at page and segment boundaries.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <tutti/nvme/prp.hpp>
#include <tutti/nvme/sgl.hpp>

using namespace tutti;
using namespace tutti::nvme;

namespace {
struct Area {
  explicit Area(std::size_t bytes, std::uint64_t bus) : memory(bytes / 8 + 1, 0), bus_address(bus), bytes(bytes) {}
  DescriptorArea view() { return DescriptorArea{memory.data(), bus_address, bytes}; }
  std::vector<std::uint64_t> memory;
  std::uint64_t bus_address;
  std::size_t bytes;
};
std::vector<std::uint64_t> scattered(std::size_t pages) {
  std::vector<std::uint64_t> bus(pages);
  for (std::size_t i = 0; i < pages; ++i) bus[i] = 0x100000 + (pages - i) * 0x2000;  // descending, gaps
  return bus;
}
}  // namespace

TEST_CASE("PRP: one page uses PRP1 only, two pages use PRP2 as a page, more use a list") {
  const auto bus = scattered(1024);
  const PageTableView table{bus.data(), bus.size(), 4096};
  Area area(8192, 0x900000);
  PrpBuild one = build_prp(table, 100, 3996, area.view());
  CHECK(one.status == StatusCode::OK);
  CHECK(one.prp1 == bus[0] + 100);
  CHECK(one.prp2 == 0);
  PrpBuild two = build_prp(table, 100, 3997, area.view());
  CHECK(two.prp2 == bus[1]);
  CHECK(two.list_entries == 0);
  PrpBuild three = build_prp(table, 0, 3 * 4096, area.view());
  CHECK(three.prp2 == area.bus_address);
  CHECK(three.list_entries == 2);
  CHECK(area.memory[0] == bus[1]);
  CHECK(area.memory[1] == bus[2]);
}

TEST_CASE("PRP: a list longer than a page chains through the last entry of each list page") {
  const auto bus = scattered(1100);
  const PageTableView table{bus.data(), bus.size(), 4096};
  Area area(3 * 4096, 0x900000);
  // 1 + 511 + 512 pages: PRP1, 511 data + chain, 512 data (the last slot of page 2 is data).
  const PrpBuild built = build_prp(table, 0, (1 + 511 + 512) * 4096ull, area.view());
  REQUIRE(built.status == StatusCode::OK);
  CHECK(built.list_entries == 1024);
  CHECK(area.memory[510] == bus[511]);
  CHECK(area.memory[511] == area.bus_address + 4096);  // chain
  CHECK(area.memory[512] == bus[512]);
  CHECK(area.memory[1023] == bus[1023]);  // last slot of a list page holding data: no chain needed
  // A list starting mid-page chains at that page's end.
  DescriptorArea skewed = area.view();
  skewed.host = reinterpret_cast<std::uint8_t*>(skewed.host) + 4096 - 16;
  skewed.bus_address += 4096 - 16;
  skewed.bytes -= 4096 - 16;
  const PrpBuild mid = build_prp(table, 0, 4 * 4096, skewed);
  REQUIRE(mid.status == StatusCode::OK);
  CHECK(mid.list_entries == 4);  // data, chain, data, data
  CHECK(area.memory[510] == bus[1]);
  CHECK(area.memory[511] == area.bus_address + 4096);
  CHECK(area.memory[512] == bus[2]);
  CHECK(area.memory[513] == bus[3]);
}

TEST_CASE("SGL: contiguous bus pages merge into one Data Block") {
  std::vector<std::uint64_t> bus(64);
  for (std::size_t i = 0; i < bus.size(); ++i) bus[i] = 0x200000 + i * 4096;
  const PageTableView table{bus.data(), bus.size(), 4096};
  Area area(4096, 0x900000);
  const SglBuild built = build_sgl(table, 123, 200000, area.view());
  REQUIRE(built.status == StatusCode::OK);
  CHECK(built.data_blocks == 1);
  CHECK(built.sgl1.type() == SglDescriptorType::data_block);
  CHECK(built.sgl1.address == 0x200000 + 123);
  CHECK(built.sgl1.length == 200000);
  CHECK(built.descriptors_written == 0);
}

TEST_CASE("SGL: scattered pages produce Segment chains ending in a Last Segment") {
  const auto bus = scattered(32);
  const PageTableView table{bus.data(), bus.size(), 4096};
  Area area(4096, 0x900000);
  const SglBuild built = build_sgl(table, 0, 10 * 4096, area.view(), 4);
  REQUIRE(built.status == StatusCode::OK);
  CHECK(built.data_blocks == 10);
  CHECK(built.descriptors_written == 12);
  CHECK(built.sgl1.type() == SglDescriptorType::segment);
  CHECK(built.sgl1.length == 4 * 16);
  const auto* d = reinterpret_cast<const SglDescriptor*>(area.memory.data());
  CHECK(d[0].type() == SglDescriptorType::data_block);
  CHECK(d[3].type() == SglDescriptorType::segment);
  CHECK(d[3].address == area.bus_address + 4 * 16);
  CHECK(d[7].type() == SglDescriptorType::last_segment);
  CHECK(d[7].length == 4 * 16);
  CHECK(d[11].type() == SglDescriptorType::data_block);
  CHECK(d[11].address == bus[9]);
  const SglBuild few = build_sgl(table, 0, 3 * 4096, area.view(), 4);
  CHECK(few.sgl1.type() == SglDescriptorType::last_segment);
  CHECK(few.sgl1.length == 3 * 16);
}
