// The KV store under a disk quota (root; EDQUOT, the quota counterpart of filesystems_test.cpp's
// ENOSPC cases). A writer process without CAP_SYS_RESOURCE (kv_helper quota-writer, started through
// `setpriv --inh-caps=-sys_resource --bounding-set=-sys_resource`: root keeps every other capability
// but is held to quotas) on a loop-mounted image whose quota is smaller than the store:
//   - creating a store larger than the quota is refused with RESOURCE_EXHAUSTED naming the quota
//     (on ext4 its hard limit and use, read with quotactl) and leaves nothing behind;
//   - once the quota is used up, the store or commit that needs more bytes fails with
//     RESOURCE_EXHAUSTED naming the quota; every block committed before stays visible and verifies,
//     the failed batch is invisible and the index drops no record, also after a remount.
// One executable, two file systems (argument --filesystem=ext4 | btrfs, one meson test each):
//   ext4   mkfs.ext4 -O quota, mount -o usrquota, a user block quota for uid 0 set with quotactl_fd;
//   btrfs  a qgroup limit on the top-level subvolume (btrfs quota enable, btrfs qgroup limit), mount
//          -o nodatacow so slot writes overwrite in place as on ext4. btrfs reserves qgroup space even
//          for an in-place overwrite, so there the step the quota refuses is a layer's store (seen with
//          Linux 6.18), where on ext4 it is the index commit; the checks hold for either.
// Each exits 77 (meson's skip) with the reason when not root, when the kernel mounts no such file
// system with quotas (ext4 needs CONFIG_QUOTA and CONFIG_QFMT_V2), or when btrfs-progs is missing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/quota.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <scratch_filesystem.hpp>

#include "kv_test_support.hpp"

using namespace tutti;
using namespace tutti::kvtest;
using tutti::testing::FilesystemType;
using tutti::testing::run_command;
using tutti::testing::ScratchFilesystem;
using Store = kv::KvStore<UringRuntime>;

namespace {

constexpr std::uint64_t kQuotaBytes = std::uint64_t{32} << 20;
constexpr std::uint64_t kOverBytes = std::uint64_t{64} << 20;  // more than the quota, less than the free space
constexpr std::uint64_t kFitBytes = std::uint64_t{16} << 20;   // 2048 slots of 2 layers x 4 KiB

FilesystemType g_type = FilesystemType::EXT4;

UringRuntime require_ok_runtime() {
  auto rt = make_uring_runtime();
  REQUIRE_MESSAGE(rt.is_ok(), rt.status().to_string());
  return std::move(rt).value();
}

/// The image with quotas on, or the reason it cannot be made here.
Result<std::unique_ptr<ScratchFilesystem>> make_quota_filesystem() {
  ScratchFilesystem::Options o;
  o.type = g_type;
  o.size_bytes = std::uint64_t{256} << 20;
  if (g_type == FilesystemType::EXT4) {
    o.mkfs_options = "-O quota -E quotatype=usrquota";
    o.mount_options = "usrquota";
  } else {
    o.mount_options = "nodatacow";
  }
  auto fs = ScratchFilesystem::create(o);
  if (!fs) return fs.status();
  if (g_type == FilesystemType::EXT4) {
    const int fd = ::open((*fs)->mount_point().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return status_from_errno(errno, "open the mount point");
    dqblk q{};
    q.dqb_bhardlimit = q.dqb_bsoftlimit = kQuotaBytes / QIF_DQBLKSIZE;
    q.dqb_valid = QIF_BLIMITS;
    const long rc = ::syscall(SYS_quotactl_fd, fd, QCMD(Q_SETQUOTA, USRQUOTA), 0, &q);
    const int e = errno;
    ::close(fd);
    if (rc != 0) return status_from_errno(e, "quotactl_fd(Q_SETQUOTA) for uid 0");
  } else {
    TUTTI_RETURN_IF_ERROR(run_command(fmt::format("btrfs quota enable {}", (*fs)->mount_point())));
    TUTTI_RETURN_IF_ERROR(run_command(fmt::format("btrfs qgroup limit {} {}", kQuotaBytes, (*fs)->mount_point())));
  }
  return fs;
}

/// Runs the helper without CAP_SYS_RESOURCE, bounded to 120 s; its output lines and exit status.
std::pair<std::vector<std::string>, int> run_quota_writer(const std::string& dir) {
  const char* helper = std::getenv("TUTTI_KV_HELPER");
  REQUIRE_MESSAGE(helper != nullptr, "TUTTI_KV_HELPER (the kv_helper binary) is not set; run through meson test");
  const std::string command = fmt::format(
      "timeout 120 setpriv --inh-caps=-sys_resource --bounding-set=-sys_resource -- '{}' quota-writer "
      "'{}' {} {} 2>&1",
      helper, dir, kOverBytes, kFitBytes);
  FILE* p = ::popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  std::vector<std::string> lines;
  char buffer[2048];
  while (std::fgets(buffer, sizeof buffer, p) != nullptr) {
    std::string s(buffer);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    lines.push_back(s);
  }
  const int status = ::pclose(p);
  return {lines, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

std::string find_line(const std::vector<std::string>& lines, std::string_view prefix) {
  for (const auto& l : lines)
    if (l.rfind(prefix, 0) == 0) return l.substr(prefix.size());
  return {};
}

/// Loads every layer of blocks [first, first + count) and CHECKs that each is OK and holds its bytes.
void check_blocks(Store& store, Buffer& buffer, MemoryHandle memory, std::uint64_t first, std::size_t count) {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < count; ++i) keys.push_back(key_of(first + i, 64));
  REQUIRE(store.lookup(views(keys)).value() == count);
  for (std::uint32_t layer = 0; layer < store.layout().layers; ++layer) {
    std::memset(buffer.data, 0xA5, count * 4096);
    auto io = store.load(views(keys), layer, pieces(memory, count, 1, 4096, 4096));
    REQUIRE(io.is_ok());
    auto r = store.wait(*io, 60 * kSecond);
    REQUIRE(r.is_ok());
    REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
    for (std::size_t i = 0; i < count; ++i) CHECK(holds(buffer.data + i * 4096, 4096, first + i, layer, 0));
  }
}

/// Reopens the store as root (writer) and checks: `stored` blocks visible, no record dropped, all
/// of them verifying, the failed batch's first block invisible.
void check_store(const std::string& dir, std::uint64_t stored, std::uint64_t failed_first) {
  UringRuntime rt = require_ok_runtime();
  auto opened = Store::open(rt, dir, one_piece_namespace(), {});
  REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
  Store& store = **opened;
  CHECK(store.statistics().visible_blocks == stored);
  CHECK(store.statistics().dropped_records == 0);
  Buffer buffer(64 * 4096);
  auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(memory.is_ok());
  for (std::uint64_t first = 0; first < stored; first += 64) check_blocks(store, buffer, *memory, first, 64);
  std::vector<std::string> failed{key_of(failed_first, 64)};
  CHECK(store.lookup(views(failed)).value() == 0);
}

}  // namespace

TEST_CASE(
    "under a disk quota: a store larger than the quota is refused naming it; a store or commit past the quota fails "
    "cleanly, earlier blocks intact, also after a remount") {
  auto made = make_quota_filesystem();
  REQUIRE_MESSAGE(made.is_ok(), made.status().to_string());
  auto& fs = *made;
  const std::string base = fs->path("quota");
  std::filesystem::create_directory(base);
  auto [lines, rc] = run_quota_writer(base);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  MESSAGE("quota-writer said:\n", all);
  REQUIRE_MESSAGE(rc == 0, "quota-writer exited ", rc);

  // Creation larger than the quota: refused, naming the quota, nothing left behind.
  const std::string create = find_line(lines, "create: ");
  CHECK(create.rfind("RESOURCE_EXHAUSTED", 0) == 0);
  CHECK(create.find("quota") != std::string::npos);
  if (g_type == FilesystemType::EXT4) {
    // quotactl reads ext4's limit: the message names it in bytes.
    CHECK(create.find(fmt::format("hard limit {} bytes", kQuotaBytes)) != std::string::npos);
    CHECK(create.find("user quota of id 0") != std::string::npos);
  } else {
    CHECK(create.find("Disk quota exceeded") != std::string::npos);
    CHECK(create.find("btrfs qgroup show") != std::string::npos);
  }
  CHECK(find_line(lines, "left: ") == "nothing");
  CHECK(!std::filesystem::exists(base + "/too-big"));
  CHECK(find_line(lines, "filler: ") == "Disk quota exceeded");

  // The first store or commit past the quota: RESOURCE_EXHAUSTED naming the quota.
  std::uint64_t stored = 0, failed_first = 0;
  std::string failure;
  for (const auto& l : lines) {
    if (l.rfind("committed ", 0) == 0) stored = std::stoull(l.substr(10));
    if (l.rfind("failed ", 0) == 0) {
      failed_first = std::stoull(l.substr(7));
      failure = l.substr(l.find(": ") + 2);
    }
  }
  REQUIRE_MESSAGE(!failure.empty(), "the quota never refused a store or a commit");
  CHECK(failed_first == stored);
  CHECK(failure.rfind("RESOURCE_EXHAUSTED", 0) == 0);
  CHECK(failure.find("Disk quota exceeded") != std::string::npos);
  if (g_type == FilesystemType::EXT4) {
    CHECK(failure.find(fmt::format("hard limit of {} bytes", kQuotaBytes)) != std::string::npos);
  }

  // Every block committed before is intact; the index dropped nothing; the same after a remount.
  // The filler goes first: btrfs holds root to its qgroup limit too, and reopening a writer commits
  // a transaction.
  std::filesystem::remove(base + "/filler");
  check_store(base + "/kv", stored, failed_first);
  REQUIRE(fs->remount().is_ok());
  check_store(base + "/kv", stored, failed_first);
}

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--filesystem=btrfs") == 0)
      g_type = FilesystemType::BTRFS;
    else if (std::strcmp(argv[i], "--filesystem=ext4") == 0)
      g_type = FilesystemType::EXT4;
    else
      rest.push_back(argv[i]);
  }
  const char* name = g_type == FilesystemType::EXT4 ? "ext4" : "btrfs";
  if (geteuid() != 0) {
    std::printf("SKIP: the quota test needs root (loop devices, mounts, quotas)\n");
    return 77;
  }
  if (g_type == FilesystemType::BTRFS && std::system("command -v mkfs.btrfs >/dev/null 2>&1") != 0) {
    std::printf("SKIP: mkfs.btrfs is missing (Debian package btrfs-progs, scripts/install-deps)\n");
    return 77;
  }
  if (auto probe = make_quota_filesystem(); !probe) {
    std::printf("SKIP: this machine cannot mount %s with quotas (%s needs CONFIG_QUOTA%s): %s\n", name, name,
                g_type == FilesystemType::EXT4 ? " and CONFIG_QFMT_V2" : " and btrfs qgroups",
                probe.status().to_string().c_str());
    return 77;
  }
  doctest::Context context(static_cast<int>(rest.size()), rest.data());
  return context.run();
}
