// accel::PlacementAllocator's failures in the host profile: a mapped_host allocation that
// allocate_mapped_host refuses throws a std::bad_alloc that carries the allocator's Status, and
// accel::allocation_failure turns it (or a plain bad_alloc) into the Status a caller reports.
// Regression: the cuda profile's batch pool reported every refused pinned allocation as "no
// memory for the state of a batch", with neither the bytes requested nor CUDA's error.
#include <doctest/doctest.h>

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/placement.hpp>

using namespace tutti;

TEST_CASE("a refused mapped_host allocation throws a bad_alloc carrying the allocator's status") {
  accel::PlacementAllocator<std::uint64_t> allocator(accel::Placement::mapped_host);
  const std::size_t too_many = accel::kMaxAllocationBytes / sizeof(std::uint64_t) + 1;
  bool thrown = false;
  try {
    (void)allocator.allocate(too_many);
  } catch (const std::bad_alloc& failure) {  // what containers and callers catch
    thrown = true;
    const auto* placed = dynamic_cast<const accel::PlacementAllocationError*>(&failure);
    REQUIRE(placed != nullptr);
    CHECK(placed->status().code() == StatusCode::INVALID_ARGUMENT);
    CHECK(placed->status().message().find(std::to_string(too_many * sizeof(std::uint64_t))) != std::string::npos);
    const Status reported = accel::allocation_failure(failure, "local_nvme: 8 bytes of request states");
    CHECK(reported.code() == StatusCode::INVALID_ARGUMENT);
    CHECK(reported.message().find("local_nvme: 8 bytes of request states: allocate_mapped_host") == 0);
  }
  CHECK(thrown);
  std::vector<std::uint64_t, accel::PlacementAllocator<std::uint64_t>> array(allocator);
  CHECK_THROWS_AS(array.assign(too_many, 0), accel::PlacementAllocationError);
  CHECK(array.empty());
}

TEST_CASE("overflowing n x sizeof(T) is refused with the count and the size") {
  accel::PlacementAllocator<std::uint64_t> allocator(accel::Placement::mapped_host);
  try {
    (void)allocator.allocate(static_cast<std::size_t>(-1) / 4);
    FAIL("allocate returned");
  } catch (const accel::PlacementAllocationError& failure) {
    CHECK(failure.status().code() == StatusCode::INVALID_ARGUMENT);
    CHECK(failure.status().message().find("overflow") != std::string::npos);
  }
}

TEST_CASE("a plain bad_alloc is reported as RESOURCE_EXHAUSTED with its context") {
  const Status reported = accel::allocation_failure(std::bad_alloc(), "local_nvme: 4096 bytes of host bookkeeping");
  CHECK(reported.code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(reported.message().find("local_nvme: 4096 bytes of host bookkeeping") == 0);
}

TEST_CASE("a mapped_host allocation in range succeeds, page-aligned and zeroed") {
  std::vector<std::uint64_t, accel::PlacementAllocator<std::uint64_t>> array(
      accel::PlacementAllocator<std::uint64_t>(accel::Placement::mapped_host));
  array.assign(1000, 7);
  CHECK(reinterpret_cast<std::uintptr_t>(array.data()) % accel::kMemoryAlignment == 0);
  CHECK(array[999] == 7);
}
