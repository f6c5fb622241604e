// The KV store on loop-mounted ext4 images (root; skips with 77 otherwise): a store larger than the
// free space is refused and leaves nothing; a commit whose index growth hits ENOSPC fails cleanly
// with earlier blocks intact after a remount; the store over local_nvme (the soft controller's NVMe
// queues on the image behind the file system) round-trips blocks, also after a remount.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <require_ok.hpp>

#include <scratch_filesystem.hpp>
#include <tutti/libnvm/soft_local_nvme.hpp>

#include "kv_test_support.hpp"

using namespace tutti;
using tutti::testing::require_ok;
using namespace tutti::kvtest;
using tutti::testing::ScratchFilesystem;

namespace {

std::unique_ptr<ScratchFilesystem> make_ext4(std::uint64_t size) {
  ScratchFilesystem::Options o;
  o.size_bytes = size;
  o.sector_size = 4096;
  auto fs = ScratchFilesystem::create(o);
  REQUIRE_MESSAGE(fs.is_ok(), fs.status().to_string());
  return std::move(fs.value());
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// Stores and commits blocks [first, first + count) of a one-piece namespace in every layer;
/// returns commit's per-key statuses. Keys are 64 bytes (the largest), so the index grows fast.
template <class Store>
std::vector<Status> store_and_commit(Store& store, Buffer& buffer, MemoryHandle memory, std::uint64_t first,
                                     std::size_t count) {
  const std::uint64_t piece = store.layout().piece_bytes[0];
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < count; ++i) keys.push_back(key_of(first + i, 64));
  for (std::uint32_t layer = 0; layer < store.layout().layers; ++layer) {
    for (std::size_t i = 0; i < count; ++i) fill(buffer.data + i * piece, piece, first + i, layer, 0);
    auto io = store.store(views(keys), layer, pieces(memory, count, 1, piece, piece));
    REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    auto r = store.wait(*io, 60 * kSecond);
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
  }
  auto committed = store.commit(views(keys), 60 * kSecond);
  REQUIRE_MESSAGE(committed.is_ok(), committed.status().to_string());
  return *committed;
}

/// Loads every layer of blocks [first, first + count) and REQUIREs each block OK and holding its bytes.
template <class Store>
void require_blocks(Store& store, Buffer& buffer, MemoryHandle memory, std::uint64_t first, std::size_t count) {
  const std::uint64_t piece = store.layout().piece_bytes[0];
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < count; ++i) keys.push_back(key_of(first + i, 64));
  REQUIRE(store.lookup(views(keys)).value() == count);
  for (std::uint32_t layer = 0; layer < store.layout().layers; ++layer) {
    std::memset(buffer.data, 0xA5, count * piece);
    auto io = store.load(views(keys), layer, pieces(memory, count, 1, piece, piece));
    REQUIRE(io.is_ok());
    auto r = store.wait(*io, 60 * kSecond);
    REQUIRE(r.is_ok());
    REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
    for (std::size_t i = 0; i < count; ++i) REQUIRE(holds(buffer.data + i * piece, piece, first + i, layer, 0));
  }
}

kv::Namespace one_piece(std::uint32_t layers, std::uint64_t piece) {
  auto ns = small_namespace(layers, piece);
  ns.piece_bytes = {piece};
  ns.kv_split = false;
  return ns;
}

}  // namespace

TEST_CASE(
    "creating a store larger than the free space of an ext4 image fails with RESOURCE_EXHAUSTED and leaves nothing "
    "behind") {
  auto fs = make_ext4(64ull << 20);
  UringRuntime rt = require_ok(make_uring_runtime());
  kv::StoreOptions o;
  o.capacity_bytes = 200ull << 20;
  // A directory the store creates: gone again.
  auto s = kv::KvStore<UringRuntime>::open(rt, fs->path("kv"), small_namespace(4), o).status();
  CHECK(s.code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK_MESSAGE(s.message().find("no space left on device") != std::string::npos, s.to_string());
  CHECK(!std::filesystem::exists(fs->path("kv")));
  // A directory that existed: exactly what it held before.
  std::filesystem::create_directory(fs->path("mine"));
  {
    std::FILE* f = std::fopen(fs->path("mine/keep").c_str(), "w");
    std::fclose(f);
  }
  s = kv::KvStore<UringRuntime>::open(rt, fs->path("mine"), small_namespace(4), o).status();
  CHECK(s.code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(names_in(fs->path("mine")) == std::set<std::string>{"keep"});
  // The same store within the free space is created.
  o.capacity_bytes = 16ull << 20;
  auto store = kv::KvStore<UringRuntime>::open(rt, fs->path("mine"), small_namespace(4), o);
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  CHECK(names_in(fs->path("mine")).count("layer-00003.kv") == 1);
}

TEST_CASE(
    "index growth on a full file system fails that commit cleanly; earlier blocks stay intact, also after a remount") {
  auto fs = make_ext4(64ull << 20);
  const auto ns = one_piece(2, 4096);
  const std::string dir = fs->path("kv");
  std::uint64_t stored = 0;
  std::size_t failed_batch_first = 0;
  {
    UringRuntime rt = require_ok(make_uring_runtime());
    kv::StoreOptions o;
    o.capacity_bytes = 32ull << 20;  // 4096 slots of 2 layers x 4 KiB
    auto opened = kv::KvStore<UringRuntime>::open(rt, dir, ns, o);
    REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
    auto& store = **opened;
    Buffer buffer(64 * 4096);
    auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE(memory.is_ok());
    for (const auto& s : store_and_commit(store, buffer, *memory, 0, 64)) REQUIRE(s.is_ok());
    stored = 64;
    // Fill the file system (root also takes the reserved blocks).
    {
      const int fd = ::open(fs->path("filler").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      REQUIRE(fd >= 0);
      std::vector<char> chunk(1 << 20, 'x');
      for (std::size_t size : {std::size_t{1} << 20, std::size_t{4096}})
        while (::write(fd, chunk.data(), size) == static_cast<ssize_t>(size)) {
        }
      ::fsync(fd);
      ::close(fd);
    }
    // Store more until a commit needs index pages the file system cannot give.
    Status failure;
    for (std::uint64_t first = 64; first < 4096 && failure.is_ok(); first += 64) {
      auto statuses = store_and_commit(store, buffer, *memory, first, 64);
      for (const auto& s : statuses)
        if (!s.is_ok()) failure = s;
      if (failure.is_ok())
        stored = first + 64;
      else
        failed_batch_first = first;
    }
    REQUIRE_MESSAGE(!failure.is_ok(), "the index never ran out of space");
    MESSAGE("commit of blocks ", failed_batch_first, "..", failed_batch_first + 63, " failed: ", failure.to_string());
    CHECK(failure.code() == StatusCode::RESOURCE_EXHAUSTED);
    CHECK(failure.message().find("No space left on device") != std::string::npos);
    CHECK(store.statistics().commit_failures == 64);
    // The failed batch is invisible; everything committed before still loads and verifies.
    std::vector<std::string> failed{key_of(failed_batch_first, 64)};
    CHECK(store.lookup(views(failed)).value() == 0);
    require_blocks(store, buffer, *memory, 0, 64);
    require_blocks(store, buffer, *memory, stored - 64, 64);
  }
  REQUIRE(fs->remount().is_ok());
  UringRuntime rt = require_ok(make_uring_runtime());
  auto opened = kv::KvStore<UringRuntime>::open(rt, dir, ns, {});
  REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
  auto& store = **opened;
  CHECK(store.statistics().visible_blocks == stored);
  CHECK(store.statistics().dropped_records == 0);
  Buffer buffer(64 * 4096);
  auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(memory.is_ok());
  for (std::uint64_t first = 0; first < stored; first += 64) require_blocks(store, buffer, *memory, first, 64);
  std::vector<std::string> failed{key_of(failed_batch_first, 64)};
  CHECK(store.lookup(views(failed)).value() == 0);
}

TEST_CASE(
    "the store over local_nvme: blocks written through the soft controller's NVMe queues load back and verify, also "
    "after a remount") {
  auto fs = make_ext4(256ull << 20);
  const auto ns = small_namespace(4, 8192);
  const std::string dir = fs->path("kv");
  auto make_stack = [&] {
    SoftLocalNvmeOptions o;
    o.backing_path = fs->image_path();
    o.block_device_path = fs->loop_device();
    o.soft.lba_size = 4096;
    o.soft.worker_threads = 2;
    auto stack = make_soft_local_nvme(o);
    REQUIRE_MESSAGE(stack.is_ok(), stack.status().to_string());
    return std::move(stack.value());
  };
  using Store = kv::KvStore<LocalNvmeRuntime>;
  const std::size_t blocks = 16;
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < blocks; ++i) keys.push_back(key_of(i));
  {
    auto stack = make_stack();
    kv::StoreOptions o;
    o.capacity_bytes = 32 * 4 * 16384;
    auto opened = Store::open(*stack->runtime, dir, ns, o);
    REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
    auto& store = **opened;
    Buffer buffer(4 * blocks * 16384);  // one region per layer: the four stores are in flight together
    auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE(memory.is_ok());
    for (std::uint32_t layer = 0; layer < 4; ++layer) {
      auto src = pieces(*memory, blocks, 2, 8192, 8192, layer * blocks * 16384);
      for (std::size_t i = 0; i < src.size(); ++i)
        fill(buffer.data + src[i].offset, 8192, i / 2, layer, static_cast<std::uint32_t>(i % 2));
      auto io = store.store(views(keys), layer, src);
      REQUIRE(io.is_ok());
    }
    for (std::uint32_t layer = 0; layer < 4; ++layer) {
      auto results = store.wait_layer(layer, 60 * kSecond);
      REQUIRE_MESSAGE(results.is_ok(), results.status().to_string());
      REQUIRE_MESSAGE(results->front().status.is_ok(), results->front().status.to_string());
    }
    const auto flushes_before = stack->device->counters().flush_commands;
    auto committed = store.commit(views(keys), 60 * kSecond);
    REQUIRE(committed.is_ok());
    for (const auto& s : *committed) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
    CHECK(stack->device->counters().flush_commands >= flushes_before + 4);  // one NVMe Flush per layer file
    for (std::uint32_t layer = 0; layer < 4; ++layer) {
      std::memset(buffer.data, 0xA5, buffer.size);
      auto io = store.load(views(keys), layer, pieces(*memory, blocks, 2, 8192, 8192));
      REQUIRE(io.is_ok());
      auto r = store.wait(*io, 60 * kSecond);
      REQUIRE(r.is_ok());
      REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
      for (std::size_t i = 0; i < blocks * 2; ++i)
        REQUIRE(holds(buffer.data + i * 8192, 8192, i / 2, layer, static_cast<std::uint32_t>(i % 2)));
    }
  }
  REQUIRE(fs->remount().is_ok());
  auto stack = make_stack();
  auto opened = Store::open(*stack->runtime, dir, ns, {});
  REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
  auto& store = **opened;
  CHECK(store.lookup(views(keys)).value() == blocks);
  Buffer buffer(blocks * 16384);
  auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(memory.is_ok());
  auto io = store.load(views(keys), 3, pieces(*memory, blocks, 2, 8192, 8192));
  REQUIRE(io.is_ok());
  auto r = store.wait(*io, 60 * kSecond);
  REQUIRE(r.is_ok());
  CHECK_MESSAGE(r->status.is_ok(), r->status.to_string());
  CHECK(r->verified_bytes == blocks * 2 * 8192);
  CHECK(holds(buffer.data + 31 * 8192, 8192, 15, 3, 1));
}
