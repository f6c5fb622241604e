#include <doctest/doctest.h>

#include <memory>
#include <set>

#include <tutti/core/handles.hpp>

using tutti::HandleTable;
using tutti::MemoryHandle;
using tutti::MemoryTag;
using tutti::StatusCode;

TEST_CASE("a default handle is null and is rejected with INVALID_ARGUMENT") {
  HandleTable<MemoryTag, int> table(tutti::next_instance_id());
  MemoryHandle h;
  CHECK(h.is_null());
  auto found = table.find(h, "memory");
  CHECK(found.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(found.status().message().find("null") != std::string::npos);
}

TEST_CASE("a released slot is reused with a new generation and the old handle is stale") {
  HandleTable<MemoryTag, int> table(tutti::next_instance_id());
  auto first = table.insert(std::make_unique<int>(1));
  REQUIRE(first.is_ok());
  CHECK(**table.find(*first, "memory") == 1);
  (void)table.erase(*first);
  auto second = table.insert(std::make_unique<int>(2));
  REQUIRE(second.is_ok());
  CHECK_FALSE(*first == *second);
  CHECK(table.find(*first, "memory").code() == StatusCode::NOT_FOUND);
  CHECK(**table.find(*second, "memory") == 2);
}

TEST_CASE("slot reuse never repeats a generation across many cycles") {
  HandleTable<MemoryTag, int> table(tutti::next_instance_id());
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    auto h = table.insert(std::make_unique<int>(i));
    REQUIRE(h.is_ok());
    CHECK(seen.insert(h->to_string()).second);
    (void)table.erase(*h);
  }
  CHECK(table.size() == 0);
}

TEST_CASE("a handle minted by another table instance is rejected") {
  HandleTable<MemoryTag, int> a(tutti::next_instance_id());
  HandleTable<MemoryTag, int> b(tutti::next_instance_id());
  auto ha = a.insert(std::make_unique<int>(1));
  auto hb = b.insert(std::make_unique<int>(1));
  REQUIRE(ha.is_ok());
  REQUIRE(hb.is_ok());
  auto found = b.find(*ha, "memory");
  CHECK(found.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(found.status().message().find("another runtime") != std::string::npos);
}
