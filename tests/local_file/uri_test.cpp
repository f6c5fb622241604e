// local_file resolver: URI validation, options validation, the sysfs partition reader and the
// extent lookup. No root needed.
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>

#include <tutti/bind/local_file.hpp>
#include <tutti/resolve/local_file.hpp>

using namespace tutti;

namespace {
local_file::LocalFileResolver::Options options_for(dev_t device, std::optional<std::uint64_t> start = 0,
                                                   std::uint32_t lba_size = 4096) {
  local_file::LocalFileResolver::Options o;
  o.device = device;
  o.partition_start_bytes = start;
  o.lba_size = lba_size;
  return o;
}
local_file::LocalFileResolver make_resolver() {
  auto r = local_file::LocalFileResolver::create(options_for(makedev(7, 0)));
  REQUIRE(r.is_ok());
  return std::move(r.value());
}
void check_invalid(std::string_view uri, std::string_view needle) {
  auto r = make_resolver().resolve(uri, {});
  CAPTURE(uri);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(r.status().message().find(needle) != std::string::npos);
}
}  // namespace

TEST_CASE("file URIs with another scheme, a host, a relative path, an empty path or a query are rejected") {
  check_invalid("memfs://x", "scheme 'memfs'");
  check_invalid("file://relative/path", "relative path");
  check_invalid("file://", "empty path");
  check_invalid("file:///", "empty path");
  check_invalid("file:///a?x=1", "no query");
  check_invalid("", "empty");
  check_invalid("file:///a%zz", "malformed");
}

TEST_CASE("percent-encoded paths are decoded before open") {
  auto r = make_resolver().resolve("file:///nonexistent%20dir/kv%2Dlayer", {});
  REQUIRE(r.code() == StatusCode::NOT_FOUND);
  CHECK(r.status().message().find("/nonexistent dir/kv-layer") != std::string::npos);
}

TEST_CASE("resolver options are validated") {
  CHECK(local_file::LocalFileResolver::create(options_for(makedev(7, 0), 0, 1024)).code() ==
        StatusCode::INVALID_ARGUMENT);
  CHECK(local_file::LocalFileResolver::create({}).code() == StatusCode::INVALID_ARGUMENT);
  local_file::LocalFileResolver::Options by_path;
  by_path.block_device_path = "/nonexistent/dev";
  CHECK(local_file::LocalFileResolver::create(by_path).code() == StatusCode::NOT_FOUND);
  by_path.block_device_path = "/dev/null";
  CHECK(local_file::LocalFileResolver::create(by_path).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(local_file::LocalFileResolver::create(options_for(makedev(7, 0), 512)).code() ==
        StatusCode::INVALID_ARGUMENT);  // not a multiple of the 4096-byte LBA size
  CHECK(local_file::LocalFileResolver::Options{}.lba_size == 4096);
  CHECK(local_file::LocalFileResolver::Options{}.nsid == 1);
  CHECK(local_file::LocalFileResolver::Options{}.fsync_policy == local_file::FsyncPolicy::writable_opens);
  CHECK(local_file::LocalFileResolver::Options{}.sysfs_root == "/sys");
}

TEST_CASE("the partition start is read from sysfs in 512-byte sectors, and 0 for a whole disk") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("tutti-sysfs-{}", ::getpid());
  fs::create_directories(root / "dev/block/259:3");
  fs::create_directories(root / "dev/block/259:0");
  std::ofstream(root / "dev/block/259:3/dev") << "259:3\n";
  std::ofstream(root / "dev/block/259:3/partition") << "1\n";
  std::ofstream(root / "dev/block/259:3/start") << "2048\n";
  std::ofstream(root / "dev/block/259:0/dev") << "259:0\n";
  fs::create_directories(root / "class/block/nvme9n1p7");
  std::ofstream(root / "class/block/nvme9n1p7/dev") << "259:7\n";
  std::ofstream(root / "class/block/nvme9n1p7/partition") << "7\n";
  std::ofstream(root / "class/block/nvme9n1p7/start") << "4096\n";

  CHECK(local_file::read_partition_start(makedev(259, 3), root.string()).value() == 2048u * 512);
  CHECK(local_file::read_partition_start(makedev(259, 0), root.string()).value() == 0u);
  CHECK(local_file::read_partition_start(makedev(259, 7), root.string()).value() == 4096u * 512);
  auto missing = local_file::read_partition_start(makedev(259, 9), root.string());
  CHECK(missing.code() == StatusCode::UNSUPPORTED);
  CHECK(missing.status().message().find("partition_start_bytes") != std::string::npos);
  auto r = [&] {
    auto o = options_for(makedev(259, 3), std::nullopt);
    o.sysfs_root = root.string();
    return local_file::LocalFileResolver::create(o);
  }();
  REQUIRE(r.is_ok());
  CHECK(*r->options().partition_start_bytes == 2048u * 512);
  fs::remove_all(root);
}

TEST_CASE("find_extent is a binary search over sorted extents") {
  std::vector<local_file::Extent> e{{0, 8192, 4096}, {4096, 65536, 8192}, {12288, 4096, 4096}};
  CHECK(local_file::find_extent(e.data(), e.size(), 0) == 0);
  CHECK(local_file::find_extent(e.data(), e.size(), 4095) == 0);
  CHECK(local_file::find_extent(e.data(), e.size(), 4096) == 1);
  CHECK(local_file::find_extent(e.data(), e.size(), 12287) == 1);
  CHECK(local_file::find_extent(e.data(), e.size(), 12288) == 2);
  CHECK(local_file::find_extent(e.data(), e.size(), 16384) == 3);
  CHECK(local_file::find_extent(e.data(), 0, 0) == 0);
  std::vector<local_file::Extent> many;
  for (std::uint64_t i = 0; i < 100000; ++i) many.push_back({i * 4096, (100000 - i) * 4096, 4096});
  for (std::uint64_t i = 0; i < 100000; i += 997)
    CHECK(local_file::find_extent(many.data(), many.size(), i * 4096 + 17) == i);
}

TEST_CASE("validate reports a gap as DATA_LOSS with its file offset and misalignment as INVALID_ARGUMENT") {
  local_file::Target t;
  t.path = "/x";
  t.lba_size = 4096;
  t.file_size = 3 * 4096;
  t.extents = {{0, 0, 4096}, {8192, 4096, 4096}};
  auto s = t.validate();
  CHECK(s.code() == StatusCode::DATA_LOSS);
  CHECK(s.message().find("file offset 4096") != std::string::npos);
  t.extents = {{0, 512, 4096}};
  t.file_size = 4096;
  CHECK(t.validate().code() == StatusCode::INVALID_ARGUMENT);
  t.extents = {{0, 0, 4096}};
  t.file_size = 5000;
  CHECK(t.validate().code() == StatusCode::DATA_LOSS);
  t.file_size = 4000;
  CHECK(t.validate().is_ok());
}
