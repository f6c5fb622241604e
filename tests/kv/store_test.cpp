// KvStore over the uring preset on real files (no root): round trips, prefixes, corruption,
// eviction and pins, commit rules, recovery at reopen, writer exclusion, and every bad input.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <require_ok.hpp>

#include <real_files.hpp>

#include "kv_test_support.hpp"

using namespace tutti;
using tutti::testing::require_ok;
using namespace tutti::kvtest;
using Store = kv::KvStore<UringRuntime>;

namespace {

std::unique_ptr<Store> open_store(UringRuntime& rt, const std::string& dir, const kv::Namespace& ns,
                                  std::uint64_t capacity, kv::StoreOptions options = {}) {
  options.capacity_bytes = capacity;
  auto store = Store::open(rt, dir, ns, options);
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  return std::move(store.value());
}

bool contains(const Status& s, std::string_view text) { return s.message().find(text) != std::string::npos; }

/// One region big enough for `blocks` blocks of the namespace, with its pieces laid back to back.
struct Region {
  Region(Store& store, std::size_t blocks) : buffer(blocks * store.layout().slot_bytes) {
    auto m = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    memory = *m;
  }
  Buffer buffer;
  MemoryHandle memory;
};

/// Stores blocks key_of(first .. first + count) in every layer (piece p of block b of layer l holds
/// fill(key, l, p); the last block's pieces are `last_length` bytes when non-zero), then commits.
void store_blocks(Store& store, Region& region, std::uint64_t first, std::size_t count, std::uint64_t last_length = 0) {
  const std::size_t P = store.layout().pieces();
  const std::uint64_t piece = store.layout().piece_bytes[0];
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < count; ++i) keys.push_back(key_of(first + i));
  auto keyviews = views(keys);
  for (std::uint32_t layer = 0; layer < store.layout().layers; ++layer) {
    auto src = pieces(region.memory, count, P, store.layout().slot_bytes / P, piece);
    if (last_length)
      for (std::size_t p = 0; p < P; ++p) src[(count - 1) * P + p].length = last_length;
    for (std::size_t i = 0; i < src.size(); ++i)
      fill(region.buffer.data + src[i].offset, src[i].length, first + i / P, layer, static_cast<std::uint32_t>(i % P));
    auto io = store.store(keyviews, layer, src);
    REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    auto r = store.wait(*io, 30 * kSecond);
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
  }
  auto committed = store.commit(keyviews, 30 * kSecond);
  REQUIRE_MESSAGE(committed.is_ok(), committed.status().to_string());
  for (const auto& s : *committed) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
}

/// Loads layer `layer` of blocks first.. into the region (poisoned first) and returns the result.
kv::LayerResult load_layer(Store& store, Region& region, std::uint64_t first, std::size_t count, std::uint32_t layer) {
  const std::size_t P = store.layout().pieces();
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < count; ++i) keys.push_back(key_of(first + i));
  std::memset(region.buffer.data, 0xA5, region.buffer.size);
  auto io = store.load(views(keys), layer,
                       pieces(region.memory, count, P, store.layout().slot_bytes / P, store.layout().piece_bytes[0]));
  REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
  auto r = store.wait(*io, 30 * kSecond);
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  return *r;
}

}  // namespace

TEST_CASE("blocks stored layer by layer and committed load back byte for byte across many layers and keys") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  const auto ns = small_namespace(6, 8192);
  const std::size_t blocks = 24;
  const std::uint64_t last = 4096 + 100;  // a shorter last block, not a multiple of 4096
  {
    auto store = open_store(rt, dir.file("kv"), ns, 64 * 6 * 16384);
    CHECK(store->layout().slots == 64);
    Region region(*store, blocks);
    store_blocks(*store, region, 0, blocks, last);
    std::vector<std::string> keys;
    for (std::size_t i = 0; i < blocks; ++i) keys.push_back(key_of(i));
    CHECK(store->lookup(views(keys)).value() == blocks);
    // Layer-wise: every layer's load submitted first, then waited layer by layer.
    Region out(*store, blocks * ns.layers);  // one region per layer: all loads are in flight together
    std::memset(out.buffer.data, 0xA5, out.buffer.size);
    const std::uint64_t stride = store->layout().slot_bytes / 2, layer_bytes = blocks * store->layout().slot_bytes;
    for (std::uint32_t layer = 0; layer < ns.layers; ++layer) {
      auto io = store->load(views(keys), layer, pieces(out.memory, blocks, 2, stride, 8192, layer * layer_bytes));
      REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    }
    for (std::uint32_t layer = 0; layer < ns.layers; ++layer) {
      auto results = store->wait_layer(layer, 30 * kSecond);
      REQUIRE_MESSAGE(results.is_ok(), results.status().to_string());
      REQUIRE(results->size() == 1);
      const kv::LayerResult& r = results->front();
      CHECK_MESSAGE(r.status.is_ok(), r.status.to_string());
      CHECK(r.ok_blocks == blocks);
      CHECK(r.bytes == (blocks - 1) * 2 * 8192 + 2 * last);
      CHECK(r.verified_bytes == r.bytes);
      for (std::size_t i = 0; i < blocks * 2; ++i) {
        const std::uint64_t length = i / 2 == blocks - 1 ? last : 8192;
        REQUIRE_MESSAGE(holds(out.buffer.data + layer * layer_bytes + i * stride, length, i / 2, layer,
                              static_cast<std::uint32_t>(i % 2)),
                        "block ", i / 2, " piece ", i % 2, " layer ", layer);
      }
    }
    const auto stats = store->statistics();
    CHECK(stats.hits == blocks * ns.layers);
    CHECK(stats.committed_blocks == blocks);
    CHECK(stats.verification_failures == 0);
    CHECK(stats.visible_blocks == blocks);
  }
  // Reopened: recovered from the index, same bytes.
  auto store = open_store(rt, dir.file("kv"), ns, 0);
  CHECK(store->statistics().visible_blocks == blocks);
  Region region(*store, blocks);
  for (std::uint32_t layer = 0; layer < ns.layers; ++layer) {
    auto r = load_layer(*store, region, 0, blocks, layer);
    CHECK_MESSAGE(r.status.is_ok(), r.status.to_string());
    CHECK(holds(region.buffer.data, 8192, 0, layer, 0));
  }
}

TEST_CASE(
    "lookup returns the stored prefix length; a partial prefix load reads the stored blocks and reports the rest "
    "NOT_FOUND") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  auto store = open_store(rt, dir.file("kv"), small_namespace(2), 32 * 2 * 16384);
  Region region(*store, 16);
  store_blocks(*store, region, 0, 10);
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < 16; ++i) keys.push_back(key_of(i));
  CHECK(store->lookup(views(keys)).value() == 10);
  std::vector<std::string> gap = keys;
  gap[4] = key_of(1000);
  CHECK(store->lookup(views(gap)).value() == 4);
  CHECK(store->lookup(std::vector<std::string_view>{}).value() == 0);
  auto r = load_layer(*store, region, 0, 16, 1);
  CHECK(r.ok_blocks == 10);
  for (std::size_t i = 0; i < 16; ++i) CHECK(r.blocks[i].code() == (i < 10 ? StatusCode::OK : StatusCode::NOT_FOUND));
  CHECK(r.status.code() == StatusCode::NOT_FOUND);
  CHECK(contains(r.blocks[12], "keys[12]"));
  CHECK(store->statistics().misses == 6);
  const std::uint64_t stride = store->layout().slot_bytes / 2;
  for (std::size_t i = 0; i < 20; ++i)
    CHECK(holds(region.buffer.data + i * stride, 8192, i / 2, 1, static_cast<std::uint32_t>(i % 2)));
}

TEST_CASE(
    "a load whose blocks share destination memory never serves a block whose bytes were overwritten by another's "
    "read") {
  // Checking each piece as its read completes must not verify bytes that a later read of the same
  // load then overwrites: 16 keys (different contents, pieces of 1 MiB, so that the reads land over
  // milliseconds and their completions arrive apart) are loaded into the same two pieces, 5 times;
  // whichever read lands last, at most one block is served, and the buffer holds it.
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  constexpr std::size_t kKeys = 16;
  constexpr std::uint64_t kPiece = 1 << 20;
  auto store = open_store(rt, dir.file("kv"), small_namespace(2, kPiece), 2 * kKeys * 2 * 2 * kPiece);
  Region region(*store, kKeys);
  store_blocks(*store, region, 0, kKeys);
  std::vector<std::string> keys;
  for (std::size_t k = 0; k < kKeys; ++k) keys.push_back(key_of(k));
  const std::uint64_t stride = store->layout().slot_bytes / 2;
  const std::vector<kv::Piece> one = pieces(region.memory, 1, 2, stride, kPiece);
  std::vector<kv::Piece> same;
  for (std::size_t k = 0; k < kKeys; ++k) same.insert(same.end(), one.begin(), one.end());
  for (int round = 0; round < 5; ++round) {
    std::memset(region.buffer.data, 0xA5, region.buffer.size);
    auto io = store->load(views(keys), 1, same);
    REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    auto r = store->wait(*io, 30 * kSecond);
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    REQUIRE(r->ok_blocks <= 1);
    for (std::uint64_t k = 0; k < kKeys; ++k)
      if (r->blocks[k].is_ok()) {
        CHECK(holds(region.buffer.data, kPiece, k, 1, 0));
        CHECK(holds(region.buffer.data + stride, kPiece, k, 1, 1));
      } else {
        CHECK(r->blocks[k].code() == StatusCode::DATA_LOSS);
      }
  }
}

TEST_CASE(
    "a block whose bytes were damaged on disk is refused at load with DATA_LOSS and counted; only the unsafe option "
    "serves it") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  const auto ns = small_namespace(2);
  std::uint32_t slot = 0;
  {
    auto store = open_store(rt, dir.file("kv"), ns, 16 * 2 * 16384);
    Region region(*store, 4);
    store_blocks(*store, region, 0, 4);
  }
  {  // Flip one byte of block 2's piece 1 in layer 1, through the file system.
    auto store = open_store(rt, dir.file("kv"), ns, 0);
    (void)store;
  }
  // Slots are taken from 0 upwards in a fresh store: block 2 is slot 2.
  slot = 2;
  const std::string path = dir.file("kv") + "/layer-00001.kv";
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const off_t at = static_cast<off_t>(slot * 16384 + 8192 + 100);
  std::uint8_t byte = 0;
  REQUIRE(::pread(fd, &byte, 1, at) == 1);
  byte ^= 0x40;
  REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
  {
    auto store = open_store(rt, dir.file("kv"), ns, 0);
    Region region(*store, 4);
    auto r = load_layer(*store, region, 0, 4, 1);
    CHECK(r.ok_blocks == 3);
    CHECK(r.blocks[2].code() == StatusCode::DATA_LOSS);
    CHECK(contains(r.blocks[2], "do not match the stored XXH3-64 checksum"));
    CHECK(contains(r.blocks[2], "not served"));
    CHECK(r.status.code() == StatusCode::DATA_LOSS);
    CHECK(store->statistics().verification_failures == 1);
    CHECK(store->statistics().hits == 3);
    auto other = load_layer(*store, region, 0, 4, 0);  // layer 0 of the same block is intact
    CHECK(other.ok_blocks == 4);
  }
  kv::StoreOptions unsafe;
  unsafe.unsafe_skip_verification = true;
  auto store = open_store(rt, dir.file("kv"), ns, 0, unsafe);
  Region region(*store, 4);
  auto r = load_layer(*store, region, 0, 4, 1);
  CHECK(r.ok_blocks == 4);
  CHECK(r.verified_bytes == 0);
  CHECK_FALSE(holds(region.buffer.data + (2 * 2 + 1) * 8192, 8192, 2, 1, 1));
}

TEST_CASE(
    "eviction under the byte bound takes unpinned blocks by CLOCK; pinned blocks are never evicted; all pinned is "
    "RESOURCE_EXHAUSTED") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  const auto ns = small_namespace(2);
  auto store = open_store(rt, dir.file("kv"), ns, 8 * 2 * 16384);  // 8 slots
  REQUIRE(store->layout().slots == 8);
  Region region(*store, 8);
  store_blocks(*store, region, 0, 8);
  std::vector<std::string> pinned{key_of(0), key_of(1)};
  REQUIRE(store->pin(views(pinned)).is_ok());
  store_blocks(*store, region, 100, 6);  // needs 6 victims among blocks 2..7
  auto stats = store->statistics();
  CHECK(stats.evictions == 6);
  CHECK(stats.visible_blocks == 8);
  CHECK(store->lookup(views(pinned)).value() == 2);
  for (std::uint32_t layer = 0; layer < 2; ++layer) {
    auto r = load_layer(*store, region, 0, 2, layer);
    CHECK_MESSAGE(r.status.is_ok(), r.status.to_string());
    CHECK(holds(region.buffer.data, 8192, 0, layer, 0));
  }
  // Pin everything visible: a new block has no slot.
  std::vector<std::string> rest;
  for (std::size_t i = 100; i < 106; ++i) rest.push_back(key_of(i));
  REQUIRE(store->pin(views(rest)).is_ok());
  std::vector<std::string> fresh{key_of(500)};
  auto io = store->store(views(fresh), 0, pieces(region.memory, 1, 2, 8192, 8192));
  REQUIRE(io.is_ok());
  auto r = store->wait(*io, 30 * kSecond);
  REQUIRE(r.is_ok());
  CHECK(r->blocks[0].code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(contains(r->blocks[0], "all 8 slots hold pinned or pending blocks"));
  CHECK(store->lookup(views(fresh)).value() == 0);
  // Explicit eviction skips pinned blocks; unpinned ones go.
  CHECK(store->evict(views(rest)).value() == 0);
  REQUIRE(store->unpin(views(rest)).is_ok());
  CHECK(store->unpin(views(rest)).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(store->evict(views(rest)).value() == 6);
  CHECK(store->lookup(views(rest)).value() == 0);
  CHECK(store->lookup(views(pinned)).value() == 2);
}

TEST_CASE(
    "a block is invisible until commit; commit before every layer is stored is NOT_READY; discard frees its slot") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  auto store = open_store(rt, dir.file("kv"), small_namespace(3), 4 * 3 * 16384);
  Region region(*store, 4);
  std::vector<std::string> keys{key_of(7)};
  auto src = pieces(region.memory, 1, 2, 8192, 8192);
  for (std::uint32_t layer = 0; layer < 2; ++layer) {
    auto io = store->store(views(keys), layer, src);
    REQUIRE(io.is_ok());
    REQUIRE(store->wait(*io, 30 * kSecond)->status.is_ok());
  }
  CHECK(store->lookup(views(keys)).value() == 0);
  auto committed = store->commit(views(keys), 30 * kSecond);
  REQUIRE(committed.is_ok());
  CHECK((*committed)[0].code() == StatusCode::NOT_READY);
  CHECK(contains((*committed)[0], "1 of 3 layers not stored yet"));
  CHECK(store->statistics().pending_blocks == 1);
  // Another length in a later layer is refused for that block.
  auto shorter = src;
  shorter[0].length = 4096;
  auto io = store->store(views(keys), 2, shorter);
  REQUIRE(io.is_ok());
  auto r = store->wait(*io, 30 * kSecond);
  CHECK(r->blocks[0].code() == StatusCode::INVALID_ARGUMENT);
  REQUIRE(store->discard(views(keys)).is_ok());
  CHECK(store->statistics().pending_blocks == 0);
  CHECK(store->commit(views(keys), 30 * kSecond).value()[0].code() == StatusCode::NOT_FOUND);
}

TEST_CASE("a second writer on the same directory is refused with BUSY naming the holder's pid") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  auto ns = small_namespace(2);
  auto first = open_store(rt, dir.file("kv"), ns, 4 * 2 * 16384);
  kv::StoreOptions o;
  o.capacity_bytes = 4 * 2 * 16384;
  auto second = Store::open(rt, dir.file("kv"), ns, o);
  REQUIRE(second.code() == StatusCode::BUSY);
  CHECK(contains(second.status(), fmt::format("process {} holds", ::getpid())));
  CHECK(contains(second.status(), "one writer per store"));
}

TEST_CASE("every bad input is refused with a message naming the field, the value and the limit") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  const auto ns = small_namespace(2);
  kv::StoreOptions o;
  o.capacity_bytes = 8 * 2 * 16384;
  auto expect = [](const Status& s, StatusCode code, std::initializer_list<std::string_view> texts) {
    CHECK_MESSAGE(s.code() == code, s.to_string());
    for (auto t : texts) CHECK_MESSAGE(contains(s, t), s.to_string(), " lacks: ", t);
  };
  {  // namespace fields and options, before anything is created
    auto bad = ns;
    bad.layers = 0;
    expect(Store::open(rt, dir.file("kv"), bad, o).status(), StatusCode::INVALID_ARGUMENT,
           {"namespace.layers = 0", "1..4096"});
    bad = ns;
    bad.piece_bytes = {};
    expect(Store::open(rt, dir.file("kv"), bad, o).status(), StatusCode::INVALID_ARGUMENT,
           {"namespace.piece_bytes", "1..16"});
    bad = ns;
    bad.tp_rank = 2;
    expect(Store::open(rt, dir.file("kv"), bad, o).status(), StatusCode::INVALID_ARGUMENT,
           {"namespace.tp_rank = 2", "tp_size = 1"});
    bad = ns;
    bad.tensor_layout = "XYZ";
    expect(Store::open(rt, dir.file("kv"), bad, o).status(), StatusCode::INVALID_ARGUMENT, {"tensor_layout = 'XYZ'"});
    kv::StoreOptions tiny = o;
    tiny.capacity_bytes = 1000;
    expect(Store::open(rt, dir.file("kv"), ns, tiny).status(), StatusCode::INVALID_ARGUMENT,
           {"options.capacity_bytes = 1000", "one block of 32768 bytes"});
    CHECK(::access(dir.file("kv").c_str(), F_OK) != 0);  // a refused creation leaves nothing
    kv::StoreOptions reader = o;
    reader.read_only = true;
    expect(Store::open(rt, dir.file("kv"), ns, reader).status(), StatusCode::NOT_FOUND, {"no KV store"});
  }
  { auto created = open_store(rt, dir.file("kv"), ns, o.capacity_bytes); }
  {  // another namespace: every differing field is named with both values
    auto other = ns;
    other.model = "other-model";
    other.block_tokens = 32;
    auto s = Store::open(rt, dir.file("kv"), other, o).status();
    expect(s, StatusCode::INVALID_ARGUMENT,
           {"namespace differs", "model: stored \"test-model@1\", requested \"other-model\"",
            "block_tokens: stored 16, requested 32"});
    other = ns;
    other.tp_rank = 0;
    other.tp_size = 2;
    expect(Store::open(rt, dir.file("kv"), other, o).status(), StatusCode::INVALID_ARGUMENT,
           {"tp_size: stored 1, requested 2"});
    kv::StoreOptions bigger = o;
    bigger.capacity_bytes *= 2;
    expect(Store::open(rt, dir.file("kv"), ns, bigger).status(), StatusCode::INVALID_ARGUMENT,
           {"options.capacity_bytes = 524288", "differs from the store's 262144"});
  }
  auto store = open_store(rt, dir.file("kv"), ns, 0);
  Region region(*store, 4);
  store_blocks(*store, region, 0, 2);
  std::vector<std::string> one{key_of(0)};
  const auto good = pieces(region.memory, 1, 2, 8192, 8192);
  // keys
  std::vector<std::string> bad_keys{key_of(0), std::string()};
  expect(store->lookup(views(bad_keys)).status(), StatusCode::INVALID_ARGUMENT, {"keys[1] has 0 bytes", "1..64"});
  bad_keys[1] = std::string(65, 'k');
  expect(store->load(views(bad_keys), 0, pieces(region.memory, 2, 2, 8192, 8192)).status(),
         StatusCode::INVALID_ARGUMENT, {"keys[1] has 65 bytes", "1..64"});
  std::vector<std::string> repeated{key_of(5), key_of(5)};
  expect(store->store(views(repeated), 0, pieces(region.memory, 2, 2, 8192, 8192)).status(),
         StatusCode::INVALID_ARGUMENT, {"keys[1]", "repeats keys[0]"});
  // layer
  expect(store->load(views(one), 2, good).status(), StatusCode::INVALID_ARGUMENT, {"layer = 2", "0..1"});
  expect(store->wait_layer(9, kSecond).status(), StatusCode::INVALID_ARGUMENT, {"layer = 9"});
  // pieces
  expect(store->load(views(one), 0, std::span(good).first(1)).status(), StatusCode::INVALID_ARGUMENT,
         {"destinations.size() = 1", "keys.size() = 1 x 2 pieces per block = 2"});
  auto misaligned = good;
  misaligned[1].offset = 8192 + 512;
  expect(store->load(views(one), 0, misaligned).status(), StatusCode::INVALID_ARGUMENT,
         {"destinations[1]: address + offset", "not a multiple of 4096"});
  auto too_long = good;
  too_long[0].length = 8193;
  expect(store->store(views(one), 0, too_long).status(), StatusCode::INVALID_ARGUMENT,
         {"sources[0].length = 8193", "1..8192 (namespace.piece_bytes[0])"});
  auto outside = good;
  outside[1].offset = region.buffer.size - 4096;
  expect(store->load(views(one), 0, outside).status(), StatusCode::OUT_OF_RANGE,
         {"destinations[1]: offset = ", "reaches past the registered region of 65536 bytes"});
  auto unregistered = good;
  unregistered[0].memory = MemoryHandle{};
  expect(store->load(views(one), 0, unregistered).status(), StatusCode::INVALID_ARGUMENT,
         {"destinations[0].memory = memory#null", "not registered with this store"});
  // a destination smaller than the stored piece: that block alone is refused, not read
  auto small = good;
  small[1].length = 4096;
  auto io = store->load(views(one), 0, small);
  REQUIRE(io.is_ok());
  auto r = store->wait(*io, kSecond * 30);
  REQUIRE(r.is_ok());
  expect(r->blocks[0], StatusCode::OUT_OF_RANGE,
         {"destinations[1].length = 4096", "below the stored piece's 8192 bytes"});
  // handles
  expect(store->wait(kv::KvIo{999}, kSecond).status(), StatusCode::NOT_FOUND, {"io = 999"});
  expect(store->unregister_memory(MemoryHandle{}), StatusCode::INVALID_ARGUMENT, {"not registered with this store"});
  expect(store->pin(views(repeated)), StatusCode::NOT_FOUND, {"keys[0]", "is not a visible block"});
}

TEST_CASE(
    "a layer the runtime cannot take at once (a queue of 2) is resubmitted as requests complete; every block arrives") {
  testing::TempDirectory dir;
  uring::Options small;
  small.queue_depth = 2;
  UringRuntime rt = require_ok(make_uring_runtime(small));
  auto store = open_store(rt, dir.file("kv"), small_namespace(2), 32 * 2 * 16384);
  Region region(*store, 24);
  store_blocks(*store, region, 0, 24);  // stores of 48 requests each, through a queue of 2
  const auto after_store = store->statistics().resubmits;
  CHECK(after_store > 0);
  for (std::uint32_t layer = 0; layer < 2; ++layer) {
    auto r = load_layer(*store, region, 0, 24, layer);
    CHECK_MESSAGE(r.status.is_ok(), r.status.to_string());
    CHECK(r.ok_blocks == 24);
    for (std::size_t i = 0; i < 48; ++i)
      CHECK(holds(region.buffer.data + i * 8192, 8192, i / 2, layer, static_cast<std::uint32_t>(i % 2)));
  }
  CHECK(store->statistics().resubmits > after_store);
  CHECK(store->statistics().verification_failures == 0);
}
