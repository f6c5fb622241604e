// The KV block store (include/tutti/kv/store.hpp) over a tuttid lease: KvStore<LocalNvmeRuntime> on the
// local_nvme runtime over a LeasedController, its layer files on the ext4 file system tuttid mounted for the
// controller's namespace (resolved with FIEMAP against the block device the lease reports), its memory from
// allocate_host_memory. Blocks are stored, committed (NVMe Flush on the leased queues) and loaded back
// verified; then tuttid stops (unmounting the namespace) and starts again (mounting it), and a new lease finds
// the blocks and loads them verified. Needs root (tuttid mounts); the suite is skipped with 77 otherwise.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tutti/kv/kv.hpp>
#include <tutti/presets/local_nvme.hpp>

#include "daemon_harness.hpp"
#include "kv_test_support.hpp"
#include "leased_controller.hpp"

namespace fs = std::filesystem;
using namespace tutti::daemon::testing;
using namespace tutti::kvtest;
using tutti::daemon::LeasedController;
using Store = tutti::kv::KvStore<tutti::LocalNvmeRuntime>;

namespace {

bool mounted(const std::string& path) {
  std::ifstream in("/proc/self/mounts");
  std::string device, point, rest;
  while (in >> device >> point && std::getline(in, rest))
    if (point == path) return true;
  return false;
}

constexpr std::uint32_t kLayers = 4;
constexpr std::size_t kBlocks = 16;
constexpr std::uint64_t kPiece = 8192;  // two pieces (K, V) per block and layer
constexpr std::uint64_t kLayerBytes = kBlocks * 2 * kPiece;

/// One client session: a lease of 2 queues, the runtime over it and the store in `dir` on the lease's
/// namespace. `write`: stores every block in every layer and commits them first. Then loads every layer and
/// checks every piece's bytes.
void session(const TestDaemon& d, const fs::path& mount_point, bool write) {
  auto leased = LeasedController::acquire({d.socket_path(), "soft0", 2, 8 << 20});
  REQUIRE_MESSAGE(leased.is_ok(), leased.status().to_string());
  LeasedController& controller = **leased;
  REQUIRE(controller.namespaces().size() == 1);
  const tutti::daemon::LeasedNamespace& ns = controller.namespaces().front();
  INFO("namespace " << ns.nsid << " at " << ns.mount << " from " << ns.block_device);
  CHECK(ns.mount == mount_point.string());
  CHECK(ns.mount_state == "mounted");
  const fs::path dir = mount_point / "kv";
  tutti::local_file::LocalFileResolver::Options resolver;
  resolver.block_device_path = ns.block_device;
  tutti::local_nvme::Options datapath;
  datapath.queue_pairs = 2;
  datapath.queue_depth = controller.queue_depth();
  auto runtime = tutti::make_local_nvme_runtime(controller, resolver, datapath);
  REQUIRE_MESSAGE(runtime.is_ok(), runtime.status().to_string());
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < kBlocks; ++i) keys.push_back(key_of(i));
  tutti::kv::StoreOptions options;
  options.capacity_bytes = write ? 32 * kLayers * 2 * kPiece : 0;
  auto opened = Store::open(*runtime, dir.string(), small_namespace(kLayers, kPiece), options);
  REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
  Store& store = **opened;
  // The store's files are on the namespace: their device is the one the lease names.
  struct stat file {
  }, device{};
  REQUIRE(::stat((dir / "layer-00000.kv").c_str(), &file) == 0);
  REQUIRE(::stat(ns.block_device.c_str(), &device) == 0);
  CHECK(file.st_dev == device.st_rdev);
  // One region for all layers (the stores are in flight together), in memory tuttid's controller reaches.
  auto memory = controller.allocate_host_memory(kLayers * kLayerBytes);
  REQUIRE_MESSAGE(memory.is_ok(), memory.status().to_string());
  auto* bytes = static_cast<std::uint8_t*>(*memory);
  auto region = store.register_memory({bytes, kLayers * kLayerBytes, tutti::MemoryKind::HOST, -1});
  REQUIRE_MESSAGE(region.is_ok(), region.status().to_string());
  if (write) {
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      auto src = pieces(*region, kBlocks, 2, kPiece, kPiece, layer * kLayerBytes);
      for (std::size_t i = 0; i < src.size(); ++i)
        fill(bytes + src[i].offset, kPiece, i / 2, layer, static_cast<std::uint32_t>(i % 2));
      auto io = store.store(views(keys), layer, src);
      REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    }
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      auto results = store.wait_layer(layer, 60 * kSecond);
      REQUIRE_MESSAGE(results.is_ok(), results.status().to_string());
      REQUIRE_MESSAGE(results->front().status.is_ok(), results->front().status.to_string());
    }
    auto committed = store.commit(views(keys), 60 * kSecond);
    REQUIRE_MESSAGE(committed.is_ok(), committed.status().to_string());
    for (const auto& s : *committed) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  }
  CHECK(store.lookup(views(keys)).value() == kBlocks);
  for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
    std::memset(bytes, 0xA5, kLayers * kLayerBytes);
    auto io = store.load(views(keys), layer, pieces(*region, kBlocks, 2, kPiece, kPiece));
    REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    auto r = store.wait(*io, 60 * kSecond);
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
    CHECK(r->verified_bytes == kBlocks * 2 * kPiece);
    for (std::size_t i = 0; i < kBlocks * 2; ++i)
      REQUIRE_MESSAGE(holds(bytes + i * kPiece, kPiece, i / 2, layer, static_cast<std::uint32_t>(i % 2)),
                      "layer " << layer << " block " << i / 2 << " piece " << i % 2);
  }
  CHECK(store.unregister_memory(*region).is_ok());
}

}  // namespace

TEST_CASE(
    "the KV store over a lease: blocks stored through the leased queues load back verified, also after tuttid "
    "restarts and mounts the namespace again") {
  const fs::path mount_point = fs::temp_directory_path() / fmt::format("tutti-kv-lease-{}", ::getpid());
  {
    TestDaemon d(
        fmt::format(R"("namespaces": [{{"nsid": 1, "mount": "{}", "filesystem": "ext4"}}])", mount_point.string()), "",
        400, 0, 64 << 20);
    REQUIRE_MESSAGE(mounted(mount_point.string()), d.log_text());
    session(d, mount_point, true);
    // tuttid stops: the namespace is unmounted, so the next session reads what reached the image.
    const int stopped = d.stop(SIGTERM);
    CHECK((WIFEXITED(stopped) && WEXITSTATUS(stopped) == 0));
    CHECK_FALSE(mounted(mount_point.string()));
    d.start();
    REQUIRE_MESSAGE(mounted(mount_point.string()), d.log_text());
    session(d, mount_point, false);
  }
  CHECK_FALSE(mounted(mount_point.string()));
  std::error_code ec;
  fs::remove_all(mount_point, ec);
}
