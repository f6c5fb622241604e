// The child process of the KV store's process tests (tests/kv/processes_test.cpp). Modes:
//
//   kv_helper writer DIR BLOCKS        stores blocks 0..BLOCKS-1 (4 per commit), prints "committed N"
//                                      after each commit, then "done", then holds the store (and so
//                                      the writer lock) until its standard input closes
//   kv_helper crash-writer DIR         stores and commits batches of 4 blocks forever, printing
//                                      "committed N"; the test kills it with SIGKILL
//   kv_helper reader DIR SECONDS       opens read-only, loops for SECONDS: follows the writer's newest
//                                      block with lookups, loads the 64 blocks before it in every layer
//                                      (racing the writer's evictions), checks every block reported OK
//                                      byte for byte; prints "reader loaded L refused R wrong W";
//                                      exit 1 when a block reported OK held wrong bytes
//   kv_helper second-writer DIR        tries to open as a writer; prints the refusal; exit 0 when
//                                      it was refused BUSY, 1 otherwise
//   kv_helper quota-writer DIR OVER FIT
//                                      run under a disk quota without CAP_SYS_RESOURCE (quota_test.cpp):
//                                      creates a store of OVER bytes in DIR/too-big (prints "create: "
//                                      and the status, then "left: " and whether DIR/too-big exists), one
//                                      of FIT bytes in DIR/kv, stores and commits 64 blocks, fills the
//                                      rest of the quota with DIR/filler ("filler: " and the errno text),
//                                      then stores and commits batches of 64 until one fails, printing
//                                      "committed N" after each and "failed F: " and the status at the
//                                      first failure (F: the batch's first block). Exit 0 when it failed.
//
// Every store here except quota-writer's uses kvtest::small_namespace(4, 8192) and kProcessCapacity;
// quota-writer's is one_piece_namespace() with 64-byte keys (the index grows fast).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kv_test_support.hpp"

using namespace tutti;
using namespace tutti::kvtest;
using Store = kv::KvStore<UringRuntime>;

namespace {

constexpr std::uint64_t kCapacity = 64 * 4 * 16384;  // 64 slots of 4 layers

int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "kv_helper: %s: %s\n", what, s.to_string().c_str());
  return 2;
}

/// The uring runtime, or exit 2 naming why it could not be made.
UringRuntime make_runtime() {
  auto runtime = make_uring_runtime();
  if (!runtime) std::exit(fail("uring runtime", runtime.status()));
  return std::move(runtime).value();
}

/// Stores blocks [first, first + count) in every layer and commits them. Returns the commit's status.
Status store_batch(Store& store, Buffer& buffer, MemoryHandle memory, std::uint64_t first, std::size_t count) {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < count; ++i) keys.push_back(key_of(first + i));
  auto keyviews = views(keys);
  for (std::uint32_t layer = 0; layer < store.layout().layers; ++layer) {
    auto src = pieces(memory, count, 2, 8192, 8192);
    for (std::size_t i = 0; i < src.size(); ++i)
      fill(buffer.data + src[i].offset, 8192, first + i / 2, layer, static_cast<std::uint32_t>(i % 2));
    auto io = store.store(keyviews, layer, src);
    if (!io) return io.status();
    auto r = store.wait(*io, 60 * kSecond);
    if (!r) return r.status();
    if (!r->status.is_ok()) return r->status;
  }
  auto committed = store.commit(keyviews, 60 * kSecond);
  if (!committed) return committed.status();
  for (const auto& s : *committed)
    if (!s.is_ok()) return s;
  return Status::success();
}

int writer(const std::string& dir, std::uint64_t blocks, bool forever) {
  UringRuntime rt = make_runtime();
  kv::StoreOptions o;
  o.capacity_bytes = kCapacity;
  auto store = Store::open(rt, dir, small_namespace(4, 8192), o);
  if (!store) return fail("open", store.status());
  Buffer buffer(8 * 8192);
  auto memory = (*store)->register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  if (!memory) return fail("register", memory.status());
  for (std::uint64_t first = 0; forever || first < blocks; first += 4) {
    if (Status s = store_batch(**store, buffer, *memory, first, 4); !s.is_ok()) return fail("store", s);
    std::printf("committed %llu\n", static_cast<unsigned long long>(first + 4));
    std::fflush(stdout);
  }
  std::printf("done\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return 0;
}

int reader(const std::string& dir, double seconds) {
  UringRuntime rt = make_runtime();
  kv::StoreOptions o;
  o.read_only = true;
  auto opened = Store::open(rt, dir, small_namespace(4, 8192), o);
  if (!opened) return fail("open", opened.status());
  Store& store = **opened;
  Buffer buffer(64 * 16384 + 2 * 16384);
  auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  if (!memory) return fail("register", memory.status());
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < 8192; ++i) keys.push_back(key_of(i));
  const auto keyviews = views(keys);
  const std::span<const std::string_view> all(keyviews);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::uint64_t loaded = 0, refused = 0, wrong = 0, frontier = 0;
  while (std::chrono::steady_clock::now() < end) {
    // Follow the writer: the newest block visible, then read the 64 before it (the oldest of them
    // are the writer's next eviction victims, so loads race evictions).
    auto visible = [&](std::uint64_t i) {
      auto hit = store.lookup(all.subspan(i, 1));
      return hit && *hit == 1;
    };
    std::uint64_t probe = frontier;  // blocks behind the writer's window are evicted: skip to the window
    while (probe < keys.size() && !visible(probe)) probe += 4;
    if (probe < keys.size()) frontier = probe;
    while (frontier + 4 < keys.size() && visible(frontier + 4)) frontier += 4;
    const std::size_t first = frontier > 60 ? frontier - 60 : 0, count = frontier + 4 - first;
    auto some = all.subspan(first, count);
    for (std::uint32_t layer = 0; layer < 4; ++layer) {
      std::memset(buffer.data, 0xA5, buffer.size);
      auto io = store.load(some, layer, pieces(*memory, count, 2, 8192, 8192));
      if (!io) return fail("load", io.status());
      auto r = store.wait(*io, 60 * kSecond);
      if (!r) return fail("wait", r.status());
      for (std::size_t k = 0; k < count; ++k) {
        if (!r->blocks[k].is_ok()) {
          if (refused++ == 0) std::fprintf(stderr, "kv_helper: first refusal: %s\n", r->blocks[k].to_string().c_str());
          // not stored yet, evicted, or replaced meanwhile: reported, never served
          continue;
        }
        ++loaded;
        for (std::uint32_t p = 0; p < 2; ++p)
          if (!holds(buffer.data + (k * 2 + p) * 8192, 8192, first + k, layer, p)) ++wrong;
      }
    }
  }
  std::printf("reader loaded %llu refused %llu wrong %llu\n", static_cast<unsigned long long>(loaded),
              static_cast<unsigned long long>(refused), static_cast<unsigned long long>(wrong));
  return wrong == 0 && loaded > 0 ? 0 : 1;
}

int second_writer(const std::string& dir) {
  UringRuntime rt = make_runtime();
  kv::StoreOptions o;
  o.capacity_bytes = kCapacity;
  auto store = Store::open(rt, dir, small_namespace(4, 8192), o);
  std::printf("%s\n", store ? "opened" : store.status().to_string().c_str());
  return !store && store.code() == StatusCode::BUSY ? 0 : 1;
}

/// quota-writer: stores and commits blocks [first, first + 64) of one_piece_namespace() (64-byte keys);
/// the first failing step's status.
Status store_batch_64(Store& store, Buffer& buffer, MemoryHandle memory, std::uint64_t first) {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < 64; ++i) keys.push_back(key_of(first + i, 64));
  auto keyviews = views(keys);
  for (std::uint32_t layer = 0; layer < store.layout().layers; ++layer) {
    for (std::size_t i = 0; i < 64; ++i) fill(buffer.data + i * 4096, 4096, first + i, layer, 0);
    auto io = store.store(keyviews, layer, pieces(memory, 64, 1, 4096, 4096));
    if (!io) return io.status().with_context("store");
    auto r = store.wait(*io, 60 * kSecond);
    if (!r) return r.status().with_context("store");
    if (!r->status.is_ok()) return r->status.with_context("store");
  }
  auto committed = store.commit(keyviews, 60 * kSecond);
  if (!committed) return committed.status().with_context("commit");
  for (const auto& s : *committed)
    if (!s.is_ok()) return s.with_context("commit");
  return Status::success();
}

int quota_writer(const std::string& dir, std::uint64_t over, std::uint64_t fit) {
  UringRuntime rt = make_runtime();
  kv::StoreOptions o;
  o.capacity_bytes = over;
  auto refused = Store::open(rt, dir + "/too-big", one_piece_namespace(), o);
  std::printf("create: %s\n", refused ? "OK" : refused.status().to_string().c_str());
  std::printf("left: %s\n", ::access((dir + "/too-big").c_str(), F_OK) == 0 ? "exists" : "nothing");
  std::fflush(stdout);
  ::sync();  // btrfs accounts freed extents to its qgroups when the transaction commits
  o.capacity_bytes = fit;
  auto store = Store::open(rt, dir + "/kv", one_piece_namespace(), o);
  if (!store) return fail("open within the quota", store.status());
  Buffer buffer(64 * 4096);
  auto memory = (*store)->register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  if (!memory) return fail("register", memory.status());
  if (Status s = store_batch_64(**store, buffer, *memory, 0); !s.is_ok()) return fail("first batch", s);
  std::printf("committed 64\n");
  // Use up the quota: 1 MiB writes, then 4 KiB ones, until the file system refuses.
  const int fd = ::open((dir + "/filler").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return fail("filler", status_from_errno(errno, "open filler"));
  std::vector<char> chunk(1 << 20, 'x');
  int filler_errno = 0;
  for (std::size_t size : {std::size_t{1} << 20, std::size_t{4096}})
    while (true) {
      const ssize_t w = ::write(fd, chunk.data(), size);
      if (w == static_cast<ssize_t>(size)) continue;
      filler_errno = w < 0 ? errno : ENOSPC;
      break;
    }
  ::fsync(fd);
  ::close(fd);
  std::printf("filler: %s\n", std::strerror(filler_errno));
  std::fflush(stdout);
  const std::uint64_t slots = (*store)->statistics().slots;
  for (std::uint64_t first = 64; first + 64 <= slots; first += 64) {
    if (Status s = store_batch_64(**store, buffer, *memory, first); !s.is_ok()) {
      std::printf("failed %llu: %s\n", static_cast<unsigned long long>(first), s.to_string().c_str());
      return 0;
    }
    std::printf("committed %llu\n", static_cast<unsigned long long>(first + 64));
    std::fflush(stdout);
  }
  std::printf("never refused\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "writer") return writer(args[1], std::stoull(args[2]), false);
  if (args.size() == 2 && args[0] == "crash-writer") return writer(args[1], 0, true);
  if (args.size() == 3 && args[0] == "reader") return reader(args[1], std::stod(args[2]));
  if (args.size() == 2 && args[0] == "second-writer") return second_writer(args[1]);
  if (args.size() == 4 && args[0] == "quota-writer")
    return quota_writer(args[1], std::stoull(args[2]), std::stoull(args[3]));
  std::fprintf(stderr,
               "usage: kv_helper writer DIR BLOCKS | crash-writer DIR | reader DIR SECONDS | second-writer DIR | "
               "quota-writer DIR OVER_BYTES FIT_BYTES\n");
  return 2;
}
