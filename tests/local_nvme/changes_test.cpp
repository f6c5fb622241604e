// A file changed under local_nvme (root): the hazard, reproduced on a loop-mounted ext4 with the
// soft controller backed by its image. File A is open in local_nvme; A is truncated and file B
// is written so that B takes A's blocks (the file system is full, so A's freed blocks are the only
// ones B can get); then A's open target is read and written. The result must be refusal or
// DATA_LOSS, never OK with B's bytes, and B must be unchanged. Also unlink and rename of an open
// target, a request in flight when its file changes, a file changed between resolve and open,
// two targets of one file, and the recovery of a file a crashed process left immutable.
//
// Every case runs under both protections (local_file::ChangeProtection):
//  - immutable_and_watch (the default): with CAP_LINUX_IMMUTABLE the file is immutable while
//    open, so the truncate, unlink and rename are refused by the file system (EPERM) and A's
//    target keeps serving A's bytes; without the capability it falls back to the watch;
//  - watch_only: the inotify watch alone, the path of a process without the capability: the
//    change succeeds and every later request of A is DATA_LOSS.
// This file is built twice: local_nvme_changes (root with every capability) and
// local_nvme_changes_unprivileged (TUTTI_TEST_DROP_CAP_LINUX_IMMUTABLE: the process drops
// CAP_LINUX_IMMUTABLE from its bounding, permitted and effective sets before main, with prctl and
// capset), so the default protection is tested on both privilege paths.
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <scratch_filesystem.hpp>
#include <tutti/libnvm/soft_local_nvme.hpp>

#include "host_buffer.hpp"
#include "test_files.hpp"

using namespace tutti;
using tutti::testing::Buffer;
using tutti::testing::ScratchFilesystem;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;
constexpr std::uint64_t kFileBytes = 4 << 20;  // A and B

bool capability_effective(int capability) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[capability / 32].effective >> (capability % 32)) & 1u;
}

#if defined(TUTTI_TEST_DROP_CAP_LINUX_IMMUTABLE)
/// Drops CAP_LINUX_IMMUTABLE for good (bounding set: the mount and losetup children cannot get it
/// back either), before any test runs.
const bool kDropped = [] {
  if (::prctl(PR_CAPBSET_DROP, CAP_LINUX_IMMUTABLE, 0, 0, 0) != 0) return false;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  const std::uint32_t bit = 1u << (CAP_LINUX_IMMUTABLE % 32);
  data[CAP_LINUX_IMMUTABLE / 32].effective &= ~bit;
  data[CAP_LINUX_IMMUTABLE / 32].permitted &= ~bit;
  data[CAP_LINUX_IMMUTABLE / 32].inheritable &= ~bit;
  return ::syscall(SYS_capset, &header, data) == 0;
}();
#endif

/// Whether the file system will refuse changes to an open target under `protection` here.
bool immutable_expected(local_file::ChangeProtection protection) {
  return protection == local_file::ChangeProtection::immutable_and_watch && capability_effective(CAP_LINUX_IMMUTABLE);
}

std::string name_of(local_file::ChangeProtection protection) {
  return protection == local_file::ChangeProtection::watch_only ? "watch_only" : "immutable_and_watch";
}

bool is_immutable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE_MESSAGE(fd >= 0, path, ": ", std::strerror(errno));
  int flags = 0;
  const int rc = ::ioctl(fd, FS_IOC_GETFLAGS, &flags);
  ::close(fd);
  REQUIRE(rc == 0);
  return (flags & FS_IMMUTABLE_FL) != 0;
}

/// The device ranges [start, end) in bytes of `path`'s blocks (FIEMAP, after a sync of the file).
std::vector<std::pair<std::uint64_t, std::uint64_t>> device_ranges(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE_MESSAGE(fd >= 0, path, ": ", std::strerror(errno));
  std::vector<std::uint64_t> storage((sizeof(fiemap) + 512 * sizeof(fiemap_extent)) / 8 + 1);
  auto* map = reinterpret_cast<fiemap*>(storage.data());
  map->fm_start = 0;
  map->fm_length = FIEMAP_MAX_OFFSET;
  map->fm_flags = FIEMAP_FLAG_SYNC;
  map->fm_extent_count = 512;
  const int rc = ::ioctl(fd, FS_IOC_FIEMAP, map);
  ::close(fd);
  REQUIRE(rc == 0);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (std::uint32_t i = 0; i < map->fm_mapped_extents; ++i)
    out.emplace_back(map->fm_extents[i].fe_physical, map->fm_extents[i].fe_physical + map->fm_extents[i].fe_length);
  return out;
}

std::uint64_t overlap_bytes(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& a,
                            const std::vector<std::pair<std::uint64_t, std::uint64_t>>& b) {
  std::uint64_t total = 0;
  for (const auto& [a0, a1] : a)
    for (const auto& [b0, b1] : b)
      if (std::max(a0, b0) < std::min(a1, b1)) total += std::min(a1, b1) - std::max(a0, b0);
  return total;
}

/// `path`'s bytes as the device holds them (O_DIRECT: the soft controller writes the image under
/// the file system's page cache).
std::vector<std::uint8_t> device_bytes(const std::string& path) {
  const std::uint64_t size = tutti::testing::file_size(path);
  const std::uint64_t rounded = (size + 4095) / 4096 * 4096;
  Buffer buffer(std::max<std::uint64_t>(rounded, 4096));
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  REQUIRE_MESSAGE(fd >= 0, path, ": ", std::strerror(errno));
  std::uint64_t done = 0;
  while (done < rounded) {
    const ssize_t n = ::pread(fd, buffer.bytes() + done, rounded - done, static_cast<off_t>(done));
    REQUIRE(n >= 0);
    if (n == 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + size);
}

/// Fills the file system with `path` until ENOSPC (1 MiB writes, then 4 KiB ones), then syncs it.
void fill_up(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  std::vector<char> chunk(1 << 20, 'f');
  for (const std::size_t step : {std::size_t{1} << 20, std::size_t{4096}})
    while (::write(fd, chunk.data(), step) == static_cast<ssize_t>(step)) {
    }
  (void)::fsync(fd);
  ::close(fd);
  ::sync();
}

/// Writes pattern(seed) into `path` (a new file) as far as the free space allows; fsync; returns
/// the bytes written.
std::uint64_t write_as_much_as_fits(const std::string& path, std::uint64_t seed, std::uint64_t length) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  const std::vector<std::uint8_t> bytes = tutti::testing::pattern(seed, 0, length);
  std::uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::write(fd, bytes.data() + done, std::min<std::uint64_t>(65536, length - done));
    if (n <= 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  (void)::fsync(fd);
  ::close(fd);
  return done;
}

/// A 64 MiB ext4 on a loop device, the soft controller over its image and the runtime.
struct Scene {
  explicit Scene(local_file::ChangeProtection protection, local_nvme::Options datapath = {}) {
    ScratchFilesystem::Options o;
    o.size_bytes = 64ull << 20;
    auto created = ScratchFilesystem::create(o);
    REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
    fs = std::move(created.value());
    SoftLocalNvmeOptions so;
    so.backing_path = fs->image_path();
    so.block_device_path = fs->loop_device();
    so.change_protection = protection;
    so.datapath = datapath;
    auto made = make_soft_local_nvme(so);
    REQUIRE_MESSAGE(made.is_ok(), made.status().to_string());
    stack = std::move(made.value());
    auto m = stack->runtime->register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    memory = *m;
  }
  ~Scene() {
    if (stack) (void)stack->runtime->unregister_memory(memory);
  }
  LocalNvmeRuntime& rt() { return *stack->runtime; }
  /// A new file `name` of kFileBytes pattern(seed) bytes, written through the file system; its path.
  std::string pattern_file(const std::string& name, std::uint64_t seed) const {
    const std::string path = fs->path(name);
    tutti::testing::write_pattern_file(path, seed, kFileBytes);
    return path;
  }

  /// One request on `target`; the submit's state when refused, else the IO's result status.
  Status io(Direction direction, TargetHandle target, std::uint64_t length, IoResult* out = nullptr) {
    IoRequest r;
    r.direction = direction;
    r.memory = memory;
    r.target = target;
    r.target_offset = 0;
    r.length = length;
    auto outcome = rt().submit(std::span<const IoRequest>(&r, 1));
    if (!outcome.initial_states[0].is_ok()) return outcome.initial_states[0];
    auto result = rt().wait(outcome.io, 30 * kSecond);
    REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
    REQUIRE(rt().release(outcome.io).is_ok());
    if (out) *out = *result;
    return result->status;
  }

  std::unique_ptr<ScratchFilesystem> fs;
  std::unique_ptr<SoftLocalNvme> stack;
  Buffer buffer{kFileBytes};
  MemoryHandle memory{};
};

void check_changed(const Status& s) {
  CHECK_MESSAGE(s.code() == StatusCode::DATA_LOSS, s.to_string());
  CHECK_MESSAGE(s.to_string().find("target changed under local_nvme") != std::string::npos, s.to_string());
}

/// A scene under the default protection with the flag in force, or null (the case is skipped, and
/// says so) when this process has no CAP_LINUX_IMMUTABLE.
std::unique_ptr<Scene> immutable_scene() {
  if (!immutable_expected(local_file::ChangeProtection::immutable_and_watch)) {
    MESSAGE("skipped: this process has no CAP_LINUX_IMMUTABLE");
    return nullptr;
  }
  return std::make_unique<Scene>(local_file::ChangeProtection::immutable_and_watch);
}

constexpr local_file::ChangeProtection kProtections[] = {local_file::ChangeProtection::immutable_and_watch,
                                                         local_file::ChangeProtection::watch_only};

}  // namespace

TEST_CASE(
    "a truncated file whose blocks another file took: reads and writes through its open target are refused, "
    "never OK with the other file's bytes, and the other file is unchanged") {
#if defined(TUTTI_TEST_DROP_CAP_LINUX_IMMUTABLE)
  REQUIRE(kDropped);
  REQUIRE_FALSE(capability_effective(CAP_LINUX_IMMUTABLE));
#endif
  for (const auto protection : kProtections) {
    const std::string protection_name = name_of(protection);
    CAPTURE(protection_name);
    Scene scene(protection);
    const std::string a = scene.pattern_file("a", 1), b = scene.fs->path("b");
    auto target = scene.rt().open("file://" + a, {.writable = true});
    REQUIRE_MESSAGE(target.is_ok(), target.status().to_string());
    CHECK(is_immutable(a) == immutable_expected(protection));
    REQUIRE(scene.io(Direction::READ, *target, kFileBytes).is_ok());
    CHECK(std::equal(scene.buffer.bytes(), scene.buffer.bytes() + kFileBytes,
                     tutti::testing::pattern(1, 0, kFileBytes).begin()));
    const auto a_blocks = device_ranges(a);

    // The file system is full, A is truncated and B is written: B can only get A's blocks.
    fill_up(scene.fs->path("filler"));
    const int truncated = ::truncate(a.c_str(), 0);
    const int truncate_errno = errno;
    ::sync();  // the journal commits: A's freed blocks become allocatable
    const std::uint64_t b_bytes = write_as_much_as_fits(b, 2, kFileBytes);
    const std::vector<std::uint8_t> b_before = device_bytes(b);
    if (immutable_expected(protection)) {
      CHECK(truncated == -1);
      CHECK(truncate_errno == EPERM);
      CHECK(overlap_bytes(device_ranges(b), a_blocks) == 0);
    } else {
      REQUIRE(truncated == 0);
      // The hazard is real here: B holds A's old blocks.
      REQUIRE(b_bytes == kFileBytes);
      CHECK(overlap_bytes(device_ranges(b), a_blocks) == kFileBytes);
      CHECK(b_before == tutti::testing::pattern(2, 0, kFileBytes));
    }

    std::memset(scene.buffer.data, 0xEE, kFileBytes);
    const Status read = scene.io(Direction::READ, *target, kFileBytes);
    if (immutable_expected(protection)) {
      CHECK_MESSAGE(read.is_ok(), read.to_string());
      CHECK(std::equal(scene.buffer.bytes(), scene.buffer.bytes() + kFileBytes,
                       tutti::testing::pattern(1, 0, kFileBytes).begin()));
    } else {
      check_changed(read);
      // Not one 4 KiB block of B reached the caller's memory.
      const auto b_pattern = tutti::testing::pattern(2, 0, kFileBytes);
      for (std::uint64_t at = 0; at < kFileBytes; at += 4096)
        CHECK_FALSE(std::equal(scene.buffer.bytes() + at, scene.buffer.bytes() + at + 4096, b_pattern.begin() + at));
    }
    const auto x = tutti::testing::pattern(3, 0, kFileBytes);
    std::copy(x.begin(), x.end(), scene.buffer.bytes());
    const Status wrote = scene.io(Direction::WRITE, *target, kFileBytes);
    if (immutable_expected(protection))
      CHECK_MESSAGE(wrote.is_ok(), wrote.to_string());  // A's own blocks: A was never truncated
    else
      check_changed(wrote);
    CHECK(device_bytes(b) == b_before);

    const Status closed = scene.rt().close(*target);
    CHECK_MESSAGE(closed.is_ok(), closed.to_string());
    CHECK_FALSE(is_immutable(a));  // cleared at close
    CHECK(::truncate(a.c_str(), 0) == 0);
  }
}

TEST_CASE(
    "unlink and rename of an open target: refused by the file system while immutable, else every later request "
    "is DATA_LOSS") {
  for (const auto protection : kProtections) {
    for (const bool rename : {false, true}) {
      const std::string protection_name = name_of(protection);
      CAPTURE(protection_name);
      CAPTURE(rename);
      Scene scene(protection);
      const std::string a = scene.pattern_file("a", 4), moved = scene.fs->path("moved");
      auto target = scene.rt().open("file://" + a, {.writable = true});
      REQUIRE_MESSAGE(target.is_ok(), target.status().to_string());
      const int rc = rename ? ::rename(a.c_str(), moved.c_str()) : ::unlink(a.c_str());
      const int e = errno;
      const Status read = scene.io(Direction::READ, *target, kFileBytes);
      const Status wrote = scene.io(Direction::WRITE, *target, kFileBytes);
      if (immutable_expected(protection)) {
        CHECK(rc == -1);
        CHECK(e == EPERM);
        CHECK_MESSAGE(read.is_ok(), read.to_string());
        CHECK_MESSAGE(wrote.is_ok(), wrote.to_string());
      } else {
        REQUIRE(rc == 0);
        check_changed(read);
        check_changed(wrote);
      }
      CHECK(scene.rt().close(*target).is_ok());
      if (rename || rc != 0) CHECK_FALSE(is_immutable(rename && rc == 0 ? moved : a));  // (an unlinked file is gone)
    }
  }
}

TEST_CASE(
    "a request in flight when its file is truncated stops issuing commands, drains, and completes with "
    "DATA_LOSS") {
  // One command in flight at a time, 4 KiB each: the 4 MiB read needs 1024 commands, issued by
  // the poll kernels of wait(); the truncate comes between submit and wait.
  local_nvme::Options o;
  o.request_window = 1;
  o.max_command_bytes = 4096;
  Scene scene(local_file::ChangeProtection::watch_only, o);
  const std::string a = scene.pattern_file("a", 5);
  auto target = scene.rt().open("file://" + a, {});
  REQUIRE_MESSAGE(target.is_ok(), target.status().to_string());
  IoRequest r;
  r.direction = Direction::READ;
  r.memory = scene.memory;
  r.target = *target;
  r.length = kFileBytes;
  auto outcome = scene.rt().submit(std::span<const IoRequest>(&r, 1));
  REQUIRE_MESSAGE(outcome.initial_states[0].is_ok(), outcome.initial_states[0].to_string());
  REQUIRE(::truncate(a.c_str(), 0) == 0);
  auto result = scene.rt().wait(outcome.io, 30 * kSecond);
  REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
  check_changed(result->status);
  CHECK(result->commands < kFileBytes / 4096);  // issuing stopped
  MESSAGE(result->commands, " of ", kFileBytes / 4096, " commands were issued before the change was seen");
  REQUIRE(scene.rt().release(outcome.io).is_ok());
  CHECK(scene.rt().close(*target).is_ok());
}

TEST_CASE("a file changed between resolve and open is refused at open with DATA_LOSS") {
  Scene scene(local_file::ChangeProtection::watch_only);
  const std::string a = scene.pattern_file("a", 6);
  local_file::LocalFileResolver::Options ro;
  ro.block_device_path = scene.fs->loop_device();
  ro.partition_start_bytes = 0;
  ro.change_protection = local_file::ChangeProtection::watch_only;
  auto resolver = local_file::LocalFileResolver::create(ro);
  REQUIRE(resolver.is_ok());
  auto path = local_nvme::LocalNvmeDataPath::create(*scene.stack->controller);
  REQUIRE_MESSAGE(path.is_ok(), path.status().to_string());
  auto resolved = resolver->resolve("file://" + a, {});
  REQUIRE_MESSAGE(resolved.is_ok(), resolved.status().to_string());
  REQUIRE(::truncate(a.c_str(), 4096) == 0);
  auto opened = path->open(std::move(resolved.value()), {});
  REQUIRE_FALSE(opened.is_ok());
  check_changed(opened.status());
}

TEST_CASE(
    "two targets of one file, read-only then writable: the second opens, and the file stays immutable until the "
    "last is closed") {
  const auto owned = immutable_scene();
  if (!owned) return;
  Scene& scene = *owned;
  const std::string a = scene.pattern_file("a", 7);
  auto first = scene.rt().open("file://" + a, {});
  REQUIRE_MESSAGE(first.is_ok(), first.status().to_string());
  CHECK(is_immutable(a));
  auto second = scene.rt().open("file://" + a, {.writable = true});  // a read-write open(2) of an immutable file
  REQUIRE_MESSAGE(second.is_ok(), second.status().to_string());
  CHECK(is_immutable(a));
  CHECK(scene.rt().close(*first).is_ok());
  CHECK(is_immutable(a));
  CHECK(::truncate(a.c_str(), 0) == -1);
  CHECK(scene.io(Direction::READ, *second, kFileBytes).is_ok());
  CHECK(scene.io(Direction::WRITE, *second, kFileBytes).is_ok());
  CHECK(scene.rt().close(*second).is_ok());
  CHECK_FALSE(is_immutable(a));
}

TEST_CASE(
    "a file left immutable by a process that ended while serving it: a writable open is BUSY naming chattr -i, "
    "and chattr -i recovers it") {
  const auto owned = immutable_scene();
  if (!owned) return;
  Scene& scene = *owned;
  const std::string a = scene.pattern_file("a", 8);
  {
    // What a crash leaves: the flag set, no process serving the file.
    const int fd = ::open(a.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    int flags = 0;
    REQUIRE(::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0);
    flags |= FS_IMMUTABLE_FL;
    REQUIRE(::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0);
    ::close(fd);
  }
  auto refused = scene.rt().open("file://" + a, {.writable = true});
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().code() == StatusCode::BUSY);
  CHECK_MESSAGE(refused.status().to_string().find("chattr -i " + a) != std::string::npos, refused.status().to_string());
  // A read-only open serves it, and leaves the flag it found.
  auto reader = scene.rt().open("file://" + a, {});
  REQUIRE_MESSAGE(reader.is_ok(), reader.status().to_string());
  CHECK(scene.rt().close(*reader).is_ok());
  CHECK(is_immutable(a));
  // The documented recovery.
  REQUIRE(tutti::testing::run_command("chattr -i " + a).is_ok());
  CHECK_FALSE(is_immutable(a));
  auto writer = scene.rt().open("file://" + a, {.writable = true});
  REQUIRE_MESSAGE(writer.is_ok(), writer.status().to_string());
  CHECK(is_immutable(a));
  CHECK(scene.rt().close(*writer).is_ok());
  CHECK_FALSE(is_immutable(a));
}
