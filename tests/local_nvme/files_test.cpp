// local_nvme over a soft controller backed by a real ext4 image (root): files written through
// the file system are read through NVMe queues and compared with what the file system returns;
// writes through NVMe are read back through the file system after a remount.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <doctest/doctest.h>

#include <scratch_filesystem.hpp>
#include <tutti/libnvm/soft_local_nvme.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/status.hpp>

#include "host_buffer.hpp"
#include "path_rig.hpp"
#include "test_files.hpp"

using namespace tutti;
using tutti::testing::FilesystemType;
using tutti::testing::ScratchFilesystem;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;

std::unique_ptr<ScratchFilesystem> make_ext4(std::uint64_t size = 256ull << 20, std::uint32_t sector = 4096) {
  ScratchFilesystem::Options o;
  o.size_bytes = size;
  o.sector_size = sector;
  auto fs = ScratchFilesystem::create(o);
  REQUIRE_MESSAGE(fs.is_ok(), fs.status().to_string());
  return std::move(fs.value());
}

std::unique_ptr<SoftLocalNvme> make_stack(const ScratchFilesystem& fs, std::uint32_t lba_size = 4096,
                                          local_nvme::LocalNvmeDataPath::Options datapath = {}) {
  SoftLocalNvmeOptions o;
  o.backing_path = fs.image_path();
  o.block_device_path = fs.loop_device();
  o.soft.lba_size = lba_size;
  o.soft.worker_threads = 2;
  o.soft.scatter_bus_pages = true;
  o.datapath = datapath;
  auto stack = make_soft_local_nvme(o);
  REQUIRE_MESSAGE(stack.is_ok(), stack.status().to_string());
  return std::move(stack.value());
}

using tutti::testing::Buffer;

IoResult run(LocalNvmeRuntime& rt, const std::vector<IoRequest>& requests) {
  return tutti::testing::run_to_completion(rt, requests, 30 * kSecond);
}

/// Reads [offset, offset + length) of the open target through NVMe, in one request.
std::vector<std::uint8_t> nvme_read(LocalNvmeRuntime& rt, TargetHandle t, MemoryHandle m, Buffer& buffer,
                                    std::uint64_t offset, std::uint64_t length, IoResult* out = nullptr) {
  IoRequest r;
  r.direction = Direction::READ;
  r.memory = m;
  r.target = t;
  r.target_offset = offset;
  r.length = length;
  IoResult result = run(rt, {r});
  REQUIRE_MESSAGE(result.status.is_ok(), result.status.to_string());
  CHECK(result.confirmed_bytes == length);
  if (out) *out = result;
  return std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + length);
}

}  // namespace

TEST_CASE("files written through ext4 read back byte for byte through the soft controller's NVMe queues") {
  auto fs = make_ext4();
  const std::string single = fs->path("single"), a = fs->path("a"), b = fs->path("b");
  tutti::testing::write_pattern_file(single, 1, 3 << 20);
  for (int i = 0; i < 100; ++i) {  // interleaved appends: many extents
    tutti::testing::append_pattern(a, 2, std::uint64_t(i) * 16384, 16384);
    tutti::testing::append_pattern(b, 3, std::uint64_t(i) * 4096, 4096);
  }
  auto stack = make_stack(*fs);
  auto& rt = *stack->runtime;
  Buffer buffer(4 << 20);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  for (const std::string& path : {single, a, b}) {
    auto t = rt.open("file://" + path);
    REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
    const std::uint64_t size = tutti::testing::file_size(path);
    IoResult result;
    auto got = nvme_read(rt, *t, *m, buffer, 0, size, &result);
    CHECK(got == tutti::testing::read_file(path, 0, size));
    MESSAGE(path, ": ", result.commands, " NVMe commands for ", size, " bytes");
    CHECK(rt.close(*t).is_ok());
  }
  // The interleaved file needs one command per extent at least. How many extents ext4 gives it
  // varies (its allocator preallocates per file), so compare with what FIEMAP reports now.
  local_file::LocalFileResolver::Options resolver_options;
  resolver_options.block_device_path = fs->loop_device();
  resolver_options.partition_start_bytes = 0;
  resolver_options.lba_size = 4096;
  auto resolver = local_file::LocalFileResolver::create(resolver_options);
  REQUIRE_MESSAGE(resolver.is_ok(), resolver.status().to_string());
  auto resolved = resolver->resolve("file://" + a, {});
  REQUIRE_MESSAGE(resolved.is_ok(), resolved.status().to_string());
  const std::size_t extents = resolved->extents.size();
  CHECK(extents > 1);
  auto t = rt.open("file://" + a);
  REQUIRE(t.is_ok());
  IoResult result;
  nvme_read(rt, *t, *m, buffer, 0, tutti::testing::file_size(a), &result);
  CHECK(result.commands >= extents);
  CHECK(rt.close(*t).is_ok());
  CHECK(rt.unregister_memory(*m).is_ok());
}

TEST_CASE("the tail rule: a file of a size that is not a multiple of 4096 reads at zero and page-aligned offsets") {
  auto fs = make_ext4();
  auto stack = make_stack(*fs);
  auto& rt = *stack->runtime;
  Buffer buffer(1 << 20);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  for (std::uint64_t size : {1ull, 4095ull, 4097ull, 100000ull}) {
    const std::string path = fs->path(fmt::format("tail{}", size));
    tutti::testing::write_pattern_file(path, size, size);
    auto t = rt.open("file://" + path);
    REQUIRE(t.is_ok());
    for (std::uint64_t offset = 0; offset < size; offset += 8192) {
      std::memset(buffer.data, 0xEE, buffer.size);
      auto got = nvme_read(rt, *t, *m, buffer, offset, size - offset);
      CHECK(got == tutti::testing::read_file(path, offset, size - offset));
      // The whole last LBA was transferred: the bytes past EOF are what ext4 left there (zeros).
      const std::uint64_t rounded = (size - offset + 4095) / 4096 * 4096;
      for (std::uint64_t i = size - offset; i < rounded; ++i) REQUIRE(buffer.bytes()[i] == 0);
    }
    // A request that ends before EOF must be LBA aligned.
    if (size > 4096) {
      IoRequest r{Direction::READ, *m, 0, *t, 0, 100};
      auto outcome = rt.submit(std::vector<IoRequest>{r});
      CHECK(outcome.initial_states[0].code() == StatusCode::INVALID_ARGUMENT);
    }
    CHECK(rt.close(*t).is_ok());
  }
  CHECK(rt.unregister_memory(*m).is_ok());
}

TEST_CASE("writes through NVMe are what ext4 returns after a remount, including the tail") {
  auto fs = make_ext4();
  const std::string path = fs->path("w");
  const std::uint64_t size = 5 * 65536 + 1234;
  tutti::testing::write_pattern_file(path, 20, size);
  {
    auto stack = make_stack(*fs);
    auto& rt = *stack->runtime;
    Buffer buffer(1 << 20);
    auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE(m.is_ok());
    auto t = rt.open("file://" + path, OpenOptions{true, false, false});
    REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
    // Overwrite [65536, 3 * 65536) and the tail [4 * 65536, size) with pattern 21; the padding
    // past EOF in the last LBA is 0xAB in memory.
    auto mid = tutti::testing::pattern(21, 65536, 2 * 65536);
    std::memcpy(buffer.bytes(), mid.data(), mid.size());
    auto tail = tutti::testing::pattern(21, 4 * 65536, size - 4 * 65536);
    std::memset(buffer.bytes() + 2 * 65536, 0xAB, 65536 + 4096);
    std::memcpy(buffer.bytes() + 2 * 65536, tail.data(), tail.size());
    IoRequest w1{Direction::WRITE, *m, 0, *t, 65536, 2 * 65536};
    IoRequest w2{Direction::WRITE, *m, 2 * 65536, *t, 4 * 65536, size - 4 * 65536};
    IoRequest flush{Direction::FLUSH, MemoryHandle{}, 0, *t, 0, 0};
    IoResult result = run(rt, {w1, w2});
    CHECK_MESSAGE(result.status.is_ok(), result.status.to_string());
    CHECK(result.confirmed_bytes == 2 * 65536 + (size - 4 * 65536));
    result = run(rt, {flush});
    CHECK(result.status.is_ok());
    CHECK(result.commands == 1);
    CHECK(stack->device->counters().flush_commands >= 1);
    CHECK(rt.close(*t).is_ok());
    CHECK(rt.unregister_memory(*m).is_ok());
  }
  REQUIRE(fs->remount().is_ok());
  auto expected = tutti::testing::pattern(20, 0, size);
  auto mid = tutti::testing::pattern(21, 65536, 2 * 65536);
  std::copy(mid.begin(), mid.end(), expected.begin() + 65536);
  auto tail = tutti::testing::pattern(21, 4 * 65536, size - 4 * 65536);
  std::copy(tail.begin(), tail.end(), expected.begin() + 4 * 65536);
  CHECK(tutti::testing::file_size(path) == size);  // the size never changes through NVMe
  CHECK(tutti::testing::read_file(path, 0, size) == expected);
  // The padding past EOF landed on the device (documented): reading the tail through NVMe shows
  // 0xAB after EOF inside the last LBA.
  {
    auto stack = make_stack(*fs);
    auto& rt = *stack->runtime;
    Buffer buffer(1 << 20);
    auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE(m.is_ok());
    auto t = rt.open("file://" + path);
    REQUIRE(t.is_ok());
    nvme_read(rt, *t, *m, buffer, 4 * 65536, size - 4 * 65536);
    for (std::uint64_t i = size - 4 * 65536; i < (size - 4 * 65536 + 4095) / 4096 * 4096; ++i)
      REQUIRE(buffer.bytes()[i] == 0xAB);
    CHECK(rt.close(*t).is_ok());
    CHECK(rt.unregister_memory(*m).is_ok());
  }
  // Extending the file through ext4 zeroes the padding before exposing it.
  REQUIRE(tutti::testing::run_command(fmt::format("truncate -s {} {}", size + 8192, path)).is_ok());
  REQUIRE(ScratchFilesystem::drop_caches().is_ok());
  auto extended = tutti::testing::read_file(path, size, 8192);
  CHECK(std::all_of(extended.begin(), extended.end(), [](std::uint8_t b) { return b == 0; }));
}

TEST_CASE("a 512-byte LBA format reads and writes files on ext4 with 4096-byte blocks") {
  auto fs = make_ext4(128ull << 20, 512);
  const std::string path = fs->path("f512");
  const std::uint64_t size = 300000;
  tutti::testing::write_pattern_file(path, 30, size);
  auto stack = make_stack(*fs, 512);
  auto& rt = *stack->runtime;
  CHECK(stack->controller->identity().lba_size == 512);
  Buffer buffer(1 << 20);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  auto t = rt.open("file://" + path, OpenOptions{true, false, false});
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  auto got = nvme_read(rt, *t, *m, buffer, 4096, size - 4096);
  CHECK(got == tutti::testing::read_file(path, 4096, size - 4096));
  // The 512-byte tail: only the last 512-byte LBA is transferred whole.
  const std::uint64_t rounded = (size - 4096 + 511) / 512 * 512;
  CHECK(buffer.bytes()[rounded] == 0xEE);
  auto data = tutti::testing::pattern(31, 8192, 8192);
  std::memcpy(buffer.bytes(), data.data(), data.size());
  IoResult result = run(rt, {IoRequest{Direction::WRITE, *m, 0, *t, 8192, 8192}});
  CHECK(result.status.is_ok());
  CHECK(rt.close(*t).is_ok());
  CHECK(rt.unregister_memory(*m).is_ok());
  stack.reset();
  REQUIRE(fs->remount().is_ok());
  CHECK(tutti::testing::read_file(path, 8192, 8192) == data);
}

TEST_CASE("open_batch opens many files; failures do not stop the others") {
  auto fs = make_ext4();
  std::vector<std::string> uris;
  for (int i = 0; i < 200; ++i) {
    const std::string path = fs->path(fmt::format("kv{}", i));
    tutti::testing::write_pattern_file(path, 100 + i, 4096 + i);
    uris.push_back("file://" + path);
  }
  uris.push_back("file://" + fs->path("missing"));
  REQUIRE(tutti::testing::run_command(fmt::format("fallocate -l 64K {}", fs->path("prealloc"))).is_ok());
  uris.push_back("file://" + fs->path("prealloc"));
  auto stack = make_stack(*fs);
  auto& rt = *stack->runtime;
  auto opened = rt.open_batch(uris);
  REQUIRE(opened.size() == uris.size());
  Buffer buffer(64 << 10);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  for (int i = 0; i < 200; ++i) {
    REQUIRE(opened[i].is_ok());
    if (i % 37 == 0) {
      auto got = nvme_read(rt, *opened[i], *m, buffer, 0, 4096 + i);
      CHECK(got == tutti::testing::pattern(100 + i, 0, 4096 + i));
    }
  }
  CHECK(opened[200].code() == StatusCode::NOT_FOUND);
  CHECK(opened[201].code() == StatusCode::DATA_LOSS);
  for (int i = 0; i < 200; ++i) CHECK(rt.close(*opened[i]).is_ok());
  CHECK(rt.unregister_memory(*m).is_ok());
}

TEST_CASE("a 1 GiB sparse-then-filled file reads through NVMe with large requests") {
  auto fs = make_ext4(1200ull << 20);
  const std::string path = fs->path("big");
  REQUIRE(tutti::testing::run_command(fmt::format("truncate -s 1G {}", path)).is_ok());
  REQUIRE(tutti::testing::run_command(fmt::format("dd if=/dev/urandom of={} bs=8M count=128 conv=notrunc,fsync", path))
              .is_ok());
  auto stack = make_stack(*fs);
  auto& rt = *stack->runtime;
  Buffer buffer(32 << 20);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  auto t = rt.open("file://" + path);
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  CHECK(rt.target_size(*t).value() == (1ull << 30));
  std::uint64_t commands = 0;
  for (std::uint64_t offset = 0; offset < (1ull << 30); offset += 32 << 20) {
    IoResult result;
    auto got = nvme_read(rt, *t, *m, buffer, offset, 32 << 20, &result);
    commands += result.commands;
    REQUIRE(got == tutti::testing::read_file(path, offset, 32 << 20));
  }
  MESSAGE("1 GiB in ", commands, " NVMe commands");
  CHECK(rt.close(*t).is_ok());
  CHECK(rt.unregister_memory(*m).is_ok());
}

TEST_CASE(
    "more files than the target handle cache's L1 holds read in rotating order, byte for byte, never re-resolved") {
  auto fs = make_ext4();
  constexpr int kFiles = 10;
  std::vector<std::string> paths;
  for (int i = 0; i < kFiles; ++i) paths.push_back(fs->path(fmt::format("layer{}", i)));
  for (int chunk = 0; chunk < 16; ++chunk)  // interleaved appends: every file has many extents
    for (int i = 0; i < kFiles; ++i)
      tutti::testing::append_pattern(paths[i], 500 + i, std::uint64_t(chunk) * 8192, 8192);
  local_nvme::LocalNvmeDataPath::Options o;
  o.device_target_cache_entries = 3;
  auto stack = make_stack(*fs, 4096, o);
  auto& rt = *stack->runtime;
  Buffer buffer(128 << 10);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  std::vector<TargetHandle> targets;
  for (const auto& path : paths) {
    auto t = rt.open("file://" + path);
    REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
    targets.push_back(*t);
  }
  const auto before = rt.datapath().target_cache_statistics();
  CHECK(before.hits + before.misses + before.fallbacks == 0);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kFiles; ++i) {
      std::memset(buffer.data, 0xEE, buffer.size);
      const std::uint64_t size = tutti::testing::file_size(paths[i]);
      REQUIRE(size == 16 * 8192);
      CHECK(nvme_read(rt, targets[i], *m, buffer, 0, size) == tutti::testing::read_file(paths[i], 0, size));
    }
  }
  auto s = rt.datapath().target_cache_statistics();
  CHECK(s.hits == 0);  // 10 files through 3 LRU entries in rotating order: every lookup misses
  CHECK(s.misses == 3 * kFiles);
  CHECK(s.evictions == 3 * kFiles - 3);
  CHECK(s.fallbacks == 0);
  CHECK(s.resident == 3);
  // The three most recent files are resident: reading them again hits.
  for (int i : {9, 8, 7}) {
    const std::uint64_t size = tutti::testing::file_size(paths[i]);
    CHECK(nvme_read(rt, targets[i], *m, buffer, 0, size) == tutti::testing::read_file(paths[i], 0, size));
  }
  CHECK(rt.datapath().target_cache_statistics().hits == 3);
  for (auto t : targets) CHECK(rt.close(t).is_ok());
  s = rt.datapath().target_cache_statistics();
  CHECK(s.resident == 0);
  CHECK(s.host_bytes == 0);
  CHECK(rt.unregister_memory(*m).is_ok());
}

TEST_CASE("a fragmented ext4 file is read and written whole at queue depths 2, 8, 16 and 17 with any window") {
  // Issue 14, 1: a request that no queue pair could ever admit was "resubmit later" forever, and at
  // depth 2 whether a piece ran depended on where ext4 put the file's extents. Two files appended
  // in turns (4 KiB each) get many extents; each is read and written whole in one request.
  auto fs = make_ext4();
  const std::string frag = fs->path("fragmented"), other = fs->path("other");
  for (int i = 0; i < 256; ++i) {
    tutti::testing::append_pattern(frag, 40, std::uint64_t(i) * 4096, 4096);
    tutti::testing::append_pattern(other, 41, std::uint64_t(i) * 4096, 4096);
  }
  ::sync();
  const std::uint64_t size = tutti::testing::file_size(frag);
  local_file::LocalFileResolver::Options resolver_options;
  resolver_options.block_device_path = fs->loop_device();
  resolver_options.partition_start_bytes = 0;
  resolver_options.lba_size = 4096;
  auto resolver = local_file::LocalFileResolver::create(resolver_options);
  REQUIRE_MESSAGE(resolver.is_ok(), resolver.status().to_string());
  std::size_t extents = 0;
  {
    auto resolved = resolver->resolve("file://" + frag, {});  // holds the file open: scoped, so remount works
    REQUIRE_MESSAGE(resolved.is_ok(), resolved.status().to_string());
    extents = resolved->extents.size();
  }
  MESSAGE("'fragmented': ", extents, " extents for ", size, " bytes");
  REQUIRE(extents >= 16);
  std::uint64_t round = 0;
  for (const std::uint32_t depth : {2u, 8u, 16u, 17u}) {
    for (const std::uint32_t window : {1u, 7u, 16u, 17u, 64u}) {
      CAPTURE(depth);
      CAPTURE(window);
      local_nvme::LocalNvmeDataPath::Options o;
      o.queue_pairs = 2;
      o.queue_depth = depth;
      o.request_window = window;
      auto stack = make_stack(*fs, 4096, o);
      auto& rt = *stack->runtime;
      CHECK(rt.datapath().options().request_window == std::min(window, depth - 1));
      Buffer buffer(size);
      auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
      REQUIRE(m.is_ok());
      auto t = rt.open("file://" + frag, {.writable = true});
      REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
      // Read whole: what ext4 holds.
      IoResult read;
      CHECK(nvme_read(rt, *t, *m, buffer, 0, size, &read) == tutti::testing::read_file(frag, 0, size));
      CHECK(read.commands >= extents);
      // Write whole with new bytes, then read through ext4 after a remount.
      ++round;
      for (std::uint64_t i = 0; i < size; ++i)
        buffer.bytes()[i] = static_cast<std::uint8_t>(i * 13 + round * 7 + i / 4096);
      const std::vector<std::uint8_t> written(buffer.bytes(), buffer.bytes() + size);
      IoRequest w;
      w.direction = Direction::WRITE;
      w.memory = *m;
      w.target = *t;
      w.length = size;
      IoResult wrote = run(rt, {w});
      REQUIRE_MESSAGE(wrote.status.is_ok(), wrote.status.to_string());
      CHECK(wrote.confirmed_bytes == size);
      CHECK(rt.close(*t).is_ok());
      CHECK(rt.unregister_memory(*m).is_ok());
      stack.reset();
      REQUIRE(fs->remount().is_ok());  // NVMe writes bypass ext4's page cache: read what the device holds
      CHECK(tutti::testing::read_file(frag, 0, size) == written);
      CHECK(tutti::testing::read_file(other, 0, 4096 * 256) == tutti::testing::pattern(41, 0, 4096 * 256));
    }
  }
}

TEST_CASE("a retryable NVMe status is retried under the runtime and counted in IoResult") {
  auto fs = make_ext4();
  const std::string path = fs->path("retried");
  tutti::testing::write_pattern_file(path, 9, 1 << 20);
  ::sync();
  auto stack = make_stack(*fs);
  auto& rt = *stack->runtime;
  Buffer buffer(1 << 20);
  auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(m.is_ok());
  auto t = rt.open("file://" + path);
  REQUIRE(t.is_ok());
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::complete_with_status;
  rule.status = nvme::make_status(nvme::GenericStatus::namespace_not_ready, false);
  rule.opcode = static_cast<int>(nvme::NvmOpcode::read);
  rule.max_fires = 2;  // the first two Read commands the controller sees
  stack->device->inject_fault(rule);
  IoResult result;
  CHECK(nvme_read(rt, *t, *m, buffer, 0, 1 << 20, &result) == tutti::testing::read_file(path, 0, 1 << 20));
  CHECK(result.retries() == 2);
  CHECK(rt.datapath().commands_retried() == 2);
  // DNR set: no retry, the IO fails with the device status.
  rule.status = nvme::make_status(nvme::GenericStatus::namespace_not_ready, true);
  rule.max_fires = 1;
  stack->device->inject_fault(rule);
  IoRequest r;
  r.memory = *m;
  r.target = *t;
  r.length = 1 << 20;
  IoResult failed = run(rt, {r});
  CHECK(failed.status.code() == StatusCode::DEVICE_ERROR);
  CHECK(failed.device_status == 0x082);
  CHECK(failed.retries() == 0);
  CHECK(rt.close(*t).is_ok());
  CHECK(rt.unregister_memory(*m).is_ok());
}
