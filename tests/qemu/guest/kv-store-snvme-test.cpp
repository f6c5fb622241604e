// Guest test of the KV block store (include/tutti/kv/) over the local_nvme DataPath on the real
// snvme driver: libnvm's SnvmeController, the emulated IOMMU on, the store's layer files on the
// ext4 file system of /dev/snvme0n1, resolved to LBAs with FIEMAP (local_file::LocalFileResolver)
// and read and written by NVMe commands on user queues, with the store's XXH3-64 verification.
// The test
//  1. opens a store in DIR (created full size and fully written by the store, so no extent is
//     unwritten), stores every layer of 24 blocks (two pieces, K and V, of 16 KiB) from registered
//     host memory, one submit per layer with all four layers in flight, and commits them (an NVMe
//     Flush per layer file before the index records),
//  2. loads every layer back into a buffer filled with 0xA5 and compares every byte, and looks up a
//     prefix whose last key was never stored (a partial hit),
//  3. tears down the store, the runtime and the controller, drops the page cache, and opens all three
//     again: the writer's open recovers the 24 blocks from the index, and a load of the last layer
//     verifies and matches byte for byte,
//  4. leaves no queue group, DMA map or pin in the driver (the suite's leaks test checks after it).
// Usage: kv-store-snvme-test DIR (a directory on the ext4 file system of /dev/snvme0n1).
// Prints "ok: ..." / "FAIL: ..." per check; exit status 0 only when every check passed.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tutti/kv/kv.hpp>
#include <tutti/presets/local_nvme.hpp>

#include "../../../libnvm/snvme/snvme_controller.hpp"
#include "../../kv/kv_test_support.hpp"
#include "guest_check.hpp"

using namespace tutti;
using namespace tutti::kvtest;
using Store = kv::KvStore<LocalNvmeRuntime>;

namespace {

using guest::check;
using guest::failures;

constexpr std::uint32_t kLayers = 4;
constexpr std::size_t kBlocks = 24;
constexpr std::uint64_t kPiece = 16384;  // K and V of one block and layer: 2 x 16 KiB
constexpr std::uint64_t kBlockBytes = 2 * kPiece;

/// The controller brought up with two queue pairs and the runtime over it, torn down in reverse.
struct Stack {
  std::unique_ptr<libnvm::SnvmeController> controller;
  std::optional<LocalNvmeRuntime> runtime;
  ~Stack() {
    if (runtime) (void)runtime->shutdown(10 * kSecond);
    runtime.reset();
  }
};

std::unique_ptr<Stack> make_stack() {
  auto stack = std::make_unique<Stack>();
  auto opened = libnvm::SnvmeController::open();
  if (!check(opened.is_ok(), "SnvmeController::open: " + opened.status().to_string())) return nullptr;
  stack->controller = std::move(opened.value());
  libnvm::BringUpOptions bring_up;
  bring_up.io_queue_pairs_requested = 2;
  Status up = stack->controller->bring_up(bring_up);
  if (!check(up.is_ok(), "bring_up with 2 queue pairs: " + up.to_string())) return nullptr;
  local_file::LocalFileResolver::Options resolver;
  resolver.block_device_path = "/dev/snvme0n1";
  local_nvme::Options datapath;
  datapath.queue_pairs = 2;
  datapath.queue_depth = 64;
  datapath.command_timeout_ns = 10 * kSecond;
  auto runtime = make_local_nvme_runtime(*stack->controller, resolver, datapath);
  if (!check(runtime.is_ok(), "make_local_nvme_runtime over /dev/snvme0n1: " + runtime.status().to_string()))
    return nullptr;
  stack->runtime.emplace(std::move(runtime.value()));
  return stack;
}

void drop_caches() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!::write(fd, "3\n", 2);
    ::close(fd);
  }
}

/// Loads `layer` of every key into `buffer` (filled with 0xA5 first) and compares every byte.
bool load_matches(Store& store, MemoryHandle memory, Buffer& buffer, const std::vector<std::string>& keys,
                  std::uint32_t layer, std::uint64_t* verified) {
  std::memset(buffer.data, 0xA5, keys.size() * kBlockBytes);
  auto io = store.load(views(keys), layer, pieces(memory, keys.size(), 2, kPiece, kPiece));
  if (!check(io.is_ok(), "load of layer " + std::to_string(layer) + " submitted: " + io.status().to_string()))
    return false;
  auto r = store.wait(*io, 60 * kSecond);
  if (!check(r.is_ok() && r->status.is_ok(), "load of layer " + std::to_string(layer) + ": " +
                                                 (r.is_ok() ? r->status.to_string() : r.status().to_string())))
    return false;
  *verified += r->verified_bytes;
  for (std::size_t i = 0; i < keys.size() * 2; ++i)
    if (!holds(buffer.data + i * kPiece, kPiece, i / 2, layer, static_cast<std::uint32_t>(i % 2))) {
      check(false, "layer " + std::to_string(layer) + " piece " + std::to_string(i) + " holds its bytes");
      return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const kv::Namespace ns = [] {
    kv::Namespace n = small_namespace(kLayers, kPiece);
    n.model = "snvme-guest@1";
    return n;
  }();
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < kBlocks; ++i) keys.push_back(key_of(i));

  {
    auto stack = make_stack();
    if (!stack) return 1;
    // Declared before the store, so the store unregisters it before it is freed.
    Buffer buffer(kLayers * kBlocks * kBlockBytes);  // one region per layer: the four stores fly together
    kv::StoreOptions options;
    options.capacity_bytes = 2 * kBlocks * kLayers * kBlockBytes;
    auto opened = Store::open(*stack->runtime, dir, ns, options);
    if (!check(opened.is_ok(), "KvStore::open in " + dir + ": " + opened.status().to_string())) return 1;
    Store& store = **opened;
    auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    if (!check(memory.is_ok(), "register_memory (DMA-mapped by the driver): " + memory.status().to_string())) return 1;
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      auto src = pieces(*memory, kBlocks, 2, kPiece, kPiece, layer * kBlocks * kBlockBytes);
      for (std::size_t i = 0; i < src.size(); ++i)
        fill(buffer.data + src[i].offset, kPiece, i / 2, layer, static_cast<std::uint32_t>(i % 2));
      auto io = store.store(views(keys), layer, src);
      check(io.is_ok(), "store of layer " + std::to_string(layer) + " submitted: " + io.status().to_string());
    }
    bool stored = true;
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      auto results = store.wait_layer(layer, 60 * kSecond);
      stored = stored && results.is_ok() && !results->empty() && results->front().status.is_ok();
    }
    check(stored, "every layer of " + std::to_string(kBlocks) + " blocks written through the user queues");
    auto committed = store.commit(views(keys), 60 * kSecond);
    bool all_committed = committed.is_ok();
    if (committed.is_ok())
      for (const auto& s : *committed) all_committed = all_committed && s.is_ok();
    check(all_committed, "commit of every block (Flush, then the index records)");

    std::uint64_t verified = 0;
    bool loaded = true;
    for (std::uint32_t layer = 0; layer < kLayers && loaded; ++layer)
      loaded = load_matches(store, *memory, buffer, keys, layer, &verified);
    check(loaded && verified == kLayers * kBlocks * kBlockBytes,
          "every layer loads back byte for byte, " + std::to_string(verified) + " bytes verified by XXH3-64");
    std::vector<std::string> prefix(keys.begin(), keys.begin() + 10);
    prefix.push_back(key_of(1000));  // never stored
    prefix.push_back(keys[11]);
    auto hit = store.lookup(views(prefix));
    check(hit.is_ok() && *hit == 10, "lookup of a prefix whose 11th key was never stored: 10 blocks");
  }

  drop_caches();
  {
    auto stack = make_stack();
    if (!stack) return 1;
    Buffer buffer(kBlocks * kBlockBytes);
    auto opened = Store::open(*stack->runtime, dir, ns, {});
    if (!check(opened.is_ok(), "KvStore::open again (recovery from the index): " + opened.status().to_string()))
      return 1;
    Store& store = **opened;
    auto found = store.lookup(views(keys));
    check(found.is_ok() && *found == kBlocks, "all " + std::to_string(kBlocks) + " blocks visible after reopen");
    auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    if (!check(memory.is_ok(), "register_memory after reopen: " + memory.status().to_string())) return 1;
    std::uint64_t verified = 0;
    check(load_matches(store, *memory, buffer, keys, kLayers - 1, &verified) && verified == kBlocks * kBlockBytes,
          "the last layer loads and verifies after reopen");
  }
  return failures ? 1 : 0;
}
