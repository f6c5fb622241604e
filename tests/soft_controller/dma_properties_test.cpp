// Property tests: PRP lists and SGLs built by tutti/nvme/{prp,sgl}.hpp decode in the soft
// controller to exactly the byte ranges they were built for; random malformed lists yield error
// statuses and never fault.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "soft_dma.hpp"
#include "soft_fixture.hpp"

using namespace tutti;
using namespace tutti::test;
using libnvm::soft::BusSegment;

namespace {

/// A region of `pages` pages whose bus pages are scattered (random, non-contiguous, some runs
/// contiguous), and a descriptor area at its own bus address.
struct FakeBus {
  explicit FakeBus(std::uint64_t pages, std::uint32_t seed) : area(1u << 20) {
    std::mt19937_64 random(seed);
    std::uint64_t next = 0x4000'0000'0000ull;
    for (std::uint64_t i = 0; i < pages; ++i) {
      // Runs of 1..4 contiguous pages separated by gaps.
      if (i == 0 || random() % 3 == 0) next += (1 + random() % 16) * 4096;
      bus.push_back(next);
      page_of_bus[next] = i;
      next += 4096;
    }
    area_bus = 0x7000'0000'0000ull + 4096 * (random() % 16);
  }
  nvme::PageTableView table() const { return nvme::PageTableView{bus.data(), bus.size(), 4096}; }
  nvme::DescriptorArea descriptor_area() { return nvme::DescriptorArea{area.data, area_bus, area.size}; }
  libnvm::soft::BusReader reader() {
    return [this](std::uint64_t address, void* destination, std::size_t length) {
      if (address < area_bus || address - area_bus > area.size || length > area.size - (address - area_bus))
        return false;
      std::memcpy(destination, area.data + (address - area_bus), length);
      return true;
    };
  }
  /// Region byte offsets covered by decoded segments, in order, as [start, end) ranges (merged).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> region_ranges(const std::vector<BusSegment>& segments) const {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (const BusSegment& s : segments) {
      std::uint64_t address = s.bus_address;
      std::uint64_t left = s.length;
      while (left > 0) {
        const auto it = page_of_bus.find(address - address % 4096);
        if (it == page_of_bus.end()) return {{~0ull, ~0ull}};
        const std::uint64_t chunk = std::min(left, 4096 - address % 4096);
        const std::uint64_t start = it->second * 4096 + address % 4096;
        if (!out.empty() && out.back().second == start)
          out.back().second += chunk;
        else
          out.emplace_back(start, start + chunk);
        address += chunk;
        left -= chunk;
      }
    }
    return out;
  }
  std::vector<std::uint64_t> bus;
  std::map<std::uint64_t, std::uint64_t> page_of_bus;
  AlignedBuffer area;
  std::uint64_t area_bus = 0;
};

}  // namespace

TEST_CASE("property: PRPs built for random (offset, length) decode to exactly [offset, offset + length)") {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    FakeBus bus(1024, seed);  // 4 MiB region
    std::mt19937_64 random(seed);
    for (int i = 0; i < 300; ++i) {
      const std::uint64_t length = 1 + random() % (i % 3 == 0 ? 8192 : (2u << 20));
      const std::uint64_t offset = (random() % ((bus.table().length() - length) / 4 + 1)) * 4;
      CAPTURE(offset);
      CAPTURE(length);
      // Lists may start anywhere 8-byte aligned in the area.
      auto area = bus.descriptor_area();
      const std::uint64_t skew = (random() % 512) * 8;
      area.host = static_cast<std::uint8_t*>(area.host) + skew;
      area.bus_address += skew;
      area.bytes -= skew;
      const nvme::PrpBuild built = nvme::build_prp(bus.table(), offset, length, area);
      REQUIRE(built.status == StatusCode::OK);
      CHECK(built.list_entries == nvme::prp_list_entries_needed(offset, length, 4096, area.bus_address % 4096));
      const auto decoded = libnvm::soft::decode_prp(built.prp1, built.prp2, length, {}, bus.reader());
      REQUIRE_MESSAGE(decoded.status.success(), nvme::describe_status(decoded.status));
      const auto ranges = bus.region_ranges(decoded.segments);
      REQUIRE(ranges.size() == 1);
      CHECK(ranges[0].first == offset);
      CHECK(ranges[0].second == offset + length);
    }
  }
}

TEST_CASE("property: SGLs built for random (offset, length) decode to exactly [offset, offset + length)") {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    FakeBus bus(1024, seed + 100);
    std::mt19937_64 random(seed);
    for (int i = 0; i < 300; ++i) {
      const std::uint64_t length = 1 + random() % (2u << 20);
      const std::uint64_t offset = random() % (bus.table().length() - length + 1);  // any byte alignment
      const std::uint32_t per_segment = 2 + static_cast<std::uint32_t>(random() % 300);
      CAPTURE(offset);
      CAPTURE(length);
      CAPTURE(per_segment);
      const nvme::SglBuild built = nvme::build_sgl(bus.table(), offset, length, bus.descriptor_area(), per_segment);
      REQUIRE(built.status == StatusCode::OK);
      libnvm::soft::DecodeLimits limits;
      limits.max_sgl_descriptors = 1u << 20;
      const auto decoded = libnvm::soft::decode_sgl(built.sgl1, length, limits, bus.reader());
      REQUIRE_MESSAGE(decoded.status.success(), nvme::describe_status(decoded.status));
      CHECK(decoded.descriptors_walked == (built.data_blocks == 1 ? 1u : built.descriptors_written));
      const auto ranges = bus.region_ranges(decoded.segments);
      REQUIRE(ranges.size() == 1);
      CHECK(ranges[0].first == offset);
      CHECK(ranges[0].second == offset + length);
    }
  }
}

TEST_CASE("builders reject out-of-range, misaligned and too-small inputs") {
  FakeBus bus(16, 5);
  auto area = bus.descriptor_area();
  CHECK(nvme::build_prp(bus.table(), 0, 0, area).status == StatusCode::OUT_OF_RANGE);
  CHECK(nvme::build_prp(bus.table(), 16 * 4096 - 4, 8, area).status == StatusCode::OUT_OF_RANGE);
  CHECK(nvme::build_prp(bus.table(), ~0ull - 3, 8, area).status == StatusCode::OUT_OF_RANGE);
  CHECK(nvme::build_prp(bus.table(), 2, 8, area).status == StatusCode::INVALID_ARGUMENT);
  auto tiny = area;
  tiny.bytes = 8;
  const nvme::PrpBuild small = nvme::build_prp(bus.table(), 0, 4 * 4096, tiny);
  CHECK(small.status == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(small.list_entries == 3);
  CHECK(nvme::build_sgl(bus.table(), 0, 0, area).status == StatusCode::OUT_OF_RANGE);
  CHECK(nvme::build_sgl(bus.table(), 0, 4096, area, 1).status == StatusCode::INVALID_ARGUMENT);
  auto tiny_sgl = area;
  tiny_sgl.bytes = 16;
  CHECK(nvme::build_sgl(bus.table(), 0, 16 * 4096, tiny_sgl).status == StatusCode::RESOURCE_EXHAUSTED);
}

TEST_CASE("property: random malformed PRP lists and SGLs give error statuses, never faults") {
  FakeBus bus(64, 9);
  std::mt19937_64 random(77);
  auto* words = reinterpret_cast<std::uint64_t*>(bus.area.data);
  int errors = 0;
  for (int i = 0; i < 4000; ++i) {
    // Garbage that sometimes looks plausible: area addresses, region pages, random values.
    for (std::size_t w = 0; w < 1024; ++w) {
      switch (random() % 4) {
        case 0: words[w] = random(); break;
        case 1: words[w] = bus.bus[random() % bus.bus.size()] + (random() % 2) * (random() % 4096); break;
        case 2: words[w] = bus.area_bus + (random() % 8192); break;
        default: words[w] = (random() & 0xff) | (std::uint64_t{random() % 6} << 60); break;
      }
    }
    const std::uint64_t length = 1 + random() % (1u << 20);
    libnvm::soft::DecodeLimits limits;
    limits.max_sgl_descriptors = 256;
    if (i % 2 == 0) {
      const auto d = libnvm::soft::decode_prp(words[random() % 8], bus.area_bus + 8 * (random() % 600), length, limits,
                                              bus.reader());
      errors += d.status.success() ? 0 : 1;
      if (d.status.success()) {
        std::uint64_t total = 0;
        for (const auto& s : d.segments) total += s.length;
        CHECK(total == length);
      }
    } else {
      nvme::SglDescriptor sgl1{};
      std::memcpy(&sgl1, bus.area.data + 16 * (random() % 32), sizeof sgl1);
      if (random() % 2)
        sgl1 = nvme::SglDescriptor::make(nvme::SglDescriptorType::segment, bus.area_bus + 16 * (random() % 16),
                                         16 * (1 + random() % 8));
      const auto d = libnvm::soft::decode_sgl(sgl1, length, limits, bus.reader());
      errors += d.status.success() ? 0 : 1;
      CHECK(d.descriptors_walked <= limits.max_sgl_descriptors);
    }
  }
  CHECK(errors > 3000);
}

TEST_CASE("property: random malformed commands through the soft controller complete with an error status") {
  libnvm::SoftControllerConfig config;
  config.max_sgl_descriptors = 512;
  SoftFixture f(config, 1u << 20, 1u << 20, 32);
  std::mt19937_64 random(1234);
  auto* words = static_cast<std::uint64_t*>(f.list_area.host_address);
  const std::uint64_t region_end = f.mapping.bus_addresses.back() + 4096;
  for (int i = 0; i < 600; ++i) {
    for (std::size_t w = 0; w < 512; ++w)
      words[w] = random() % 2 ? f.mapping.bus_addresses[random() % f.mapping.bus_addresses.size()] +
                                    (random() % 3 == 0 ? random() % 4096 : 0)
                              : random();
    nvme::SubmissionQueueEntry sqe{};
    sqe.opcode = static_cast<std::uint8_t>(random() % 3 == 0 ? random() % 16 : (random() % 2 ? 1 : 2));
    sqe.nsid = random() % 10 == 0 ? static_cast<std::uint32_t>(random()) : 1;
    sqe.flags = static_cast<std::uint8_t>(random() % 4 == 0 ? random() : (random() % 2) << 6);
    sqe.cdw10 = static_cast<std::uint32_t>(random() % 300);
    sqe.cdw12 = static_cast<std::uint32_t>(random() % 64);
    if (sqe.data_pointer_kind() == nvme::DataPointerKind::prp) {
      sqe.data_pointer.prp.prp1 = random() % 2 ? f.mapping.bus_addresses[random() % 256] + (random() % 4096) : random();
      sqe.data_pointer.prp.prp2 = random() % 2 ? f.list_area.bus_address + 8 * (random() % 512) : random();
    } else {
      sqe.data_pointer.sgl1 =
          nvme::SglDescriptor::make(static_cast<nvme::SglDescriptorType>(random() % 6),
                                    random() % 2 ? f.list_area.bus_address + 16 * (random() % 64) : random(),
                                    static_cast<std::uint32_t>(16 * (random() % 40)));
    }
    const auto cqe = f.run(sqe);
    (void)region_end;
    CHECK(cqe.sq_identifier == f.io.info.qid);
  }
  // The controller is still healthy and correct afterwards.
  CHECK_FALSE(f.controller->controller_status().fatal());
  std::memset(f.region.data, 0, 4096);
  CHECK(f.run(f.read_write(false, 0, 1, 0)).status().success());
  CHECK(f.device->counters().errors > 300);
}
