// The memfs resolver and DataPath on their own.
#include <doctest/doctest.h>

#include <tutti/tutti.hpp>

using namespace tutti;

TEST_CASE("memfs files are shared by name and keep their size") {
  memfs::MemfsResolver resolver;
  auto a = resolver.resolve("memfs://shared?size=4096", {});
  auto b = resolver.resolve("memfs://shared", {});
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  CHECK(a->file == b->file);
  CHECK(b->size_bytes() == 4096);
}

TEST_CASE("the memfs store refuses files past its total budget with RESOURCE_EXHAUSTED") {
  auto store = std::make_shared<memfs::Store>(memfs::Store::Options{.max_file_bytes = 4096, .max_total_bytes = 8192});
  memfs::MemfsResolver resolver(store);
  CHECK(resolver.resolve("memfs://one?size=4096", {}).is_ok());
  CHECK(resolver.resolve("memfs://two?size=4096", {}).is_ok());
  auto three = resolver.resolve("memfs://three?size=4096", {});
  CHECK(three.code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(resolver.resolve("memfs://big?size=4097", {}).code() == StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("the memfs DataPath satisfies the DataPath concept and binds with its resolver") {
  static_assert(tutti::DataPath<memfs::MemfsDataPath>);
  static_assert(tutti::Resolver<memfs::MemfsResolver>);
  static_assert(memfs::MemfsDataPath::capabilities.memory_kinds.contains(MemoryKind::PINNED_HOST));
  static_assert(!memfs::MemfsDataPath::capabilities.memory_kinds.contains(MemoryKind::DEVICE));
  CHECK(std::string_view(memfs::MemfsDataPath::name) == "memfs");
}
