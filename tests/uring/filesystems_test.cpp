// The uring backend on scratch file systems (root only; exits 77 otherwise): ext4 loop images with 512-
// and 4096-byte sectors, tmpfs, ramfs (no O_DIRECT) and a read-only mount. Every byte is checked
// against what the file system returns to a plain pread after the page cache was dropped.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <scratch_filesystem.hpp>

#include "uring_test_support.hpp"

using namespace tutti;
using namespace tutti::testing;

namespace {

std::unique_ptr<ScratchFilesystem> make_fs(FilesystemType type, std::uint32_t sector_size = 512) {
  auto fs =
      ScratchFilesystem::create({.type = type, .size_bytes = std::uint64_t{128} << 20, .sector_size = sector_size});
  REQUIRE_MESSAGE(fs.is_ok(), fs.status().to_string());
  return std::move(fs.value());
}

/// A file system mounted with `mount -t TYPE` in a fresh directory (ramfs here), unmounted at the end.
struct Mount {
  explicit Mount(const std::string& type, const std::string& options = "") {
    char templ[] = "/tmp/tutti-mnt-XXXXXX";
    REQUIRE(::mkdtemp(templ) != nullptr);
    path = templ;
    REQUIRE(run_command(fmt::format("mount -t {} {} {} {}", type, options.empty() ? "" : "-o " + options, type, path))
                .is_ok());
  }
  ~Mount() {
    (void)run_command(fmt::format("umount {}", path));
    ::rmdir(path.c_str());
  }
  std::string path;
};

/// Writes through uring (aligned part and tail), reads back through uring, compares both with a
/// plain pread after drop_caches.
void round_trip(const std::string& path, const OpenOptions& options) {
  const std::uint64_t size = 37 * 4096 + 3000;
  write_pattern_file(path, size, 21);
  UringRuntime runtime = require_ok(make_uring_runtime());
  auto t = runtime.open("file://" + path, options);
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  AlignedBuffer out(size), in(size);
  for (std::uint64_t i = 0; i < size; ++i) out.get()[i] = pattern_byte(i, 77);
  auto mo = runtime.register_memory(out.view());
  auto mi = runtime.register_memory(in.view());
  REQUIRE(mo.is_ok());
  REQUIRE(mi.is_ok());
  auto w = run_all(runtime, {{Direction::WRITE, *mo, 0, *t, 0, 8 * 4096},
                             {Direction::WRITE, *mo, 20 * 4096, *t, 20 * 4096, size - 20 * 4096},
                             {Direction::FLUSH, {}, 0, *t, 0, 0}});
  for (const auto& c : w) REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
  CHECK(file_size(path) == size);
  REQUIRE(ScratchFilesystem::drop_caches().is_ok());
  const auto plain = read_plain(path, 0, size);
  CHECK(std::memcmp(plain.data(), out.get(), 8 * 4096) == 0);
  CHECK(matches_pattern(plain.data() + 8 * 4096, 8 * 4096, 12 * 4096, 21));
  CHECK(std::memcmp(plain.data() + 20 * 4096, out.get() + 20 * 4096, size - 20 * 4096) == 0);

  REQUIRE(ScratchFilesystem::drop_caches().is_ok());
  std::vector<IoRequest> reads;
  for (std::uint64_t u = 0; u < 37; ++u) reads.push_back({Direction::READ, *mi, u * 4096, *t, u * 4096, 4096});
  reads.push_back({Direction::READ, *mi, 37 * 4096, *t, 37 * 4096, 3000});
  auto r = run_all(runtime, reads);
  for (const auto& c : r) REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
  CHECK(std::memcmp(in.get(), plain.data(), size) == 0);
}

}  // namespace

TEST_CASE("ext4 on a 512-byte-sector loop device: O_DIRECT round trip byte for byte") {
  auto fs = make_fs(FilesystemType::EXT4, 512);
  const auto path = fs->path("kv");
  write_pattern_file(path, 4096, 1);
  auto t = file::FileResolver{}.resolve("file://" + path, {});
  REQUIRE(t.is_ok());
  CHECK(t->direct);
  CHECK(t->filesystem == "ext4");
  CHECK(t->direct_io_alignment == 512);
  round_trip(path, {.writable = true});
}

TEST_CASE("ext4 on a 4096-byte-sector loop device: alignment 4096 and the tail rule still hold") {
  auto fs = make_fs(FilesystemType::EXT4, 4096);
  const auto path = fs->path("kv");
  write_pattern_file(path, 4096, 1);
  auto t = file::FileResolver{}.resolve("file://" + path, {});
  REQUIRE(t.is_ok());
  CHECK(t->direct);
  CHECK(t->direct_io_alignment == 4096);
  round_trip(path, {.writable = true});
}

TEST_CASE("ext4: a file truncated under an open target fails OUT_OF_RANGE from the device, not stale cache") {
  auto fs = make_fs(FilesystemType::EXT4);
  const auto path = fs->path("shrink");
  write_pattern_file(path, 64 * 4096, 3);
  UringRuntime runtime = require_ok(make_uring_runtime());
  auto t = runtime.open("file://" + path);
  REQUIRE(t.is_ok());
  AlignedBuffer buffer(64 * 4096);
  auto m = runtime.register_memory(buffer.view());
  REQUIRE(m.is_ok());
  REQUIRE(::truncate(path.c_str(), 10 * 4096) == 0);
  REQUIRE(ScratchFilesystem::drop_caches().is_ok());
  auto c = run_all(runtime, {{Direction::READ, *m, 0, *t, 0, 10 * 4096},
                             {Direction::READ, *m, 0, *t, 8 * 4096, 8 * 4096},
                             {Direction::READ, *m, 0, *t, 32 * 4096, 32 * 4096}});
  CHECK(c[0].status.is_ok());
  CHECK(c[1].status.code() == StatusCode::OUT_OF_RANGE);
  CHECK(c[1].confirmed_bytes == 2 * 4096);
  CHECK(c[2].status.code() == StatusCode::OUT_OF_RANGE);
  CHECK(c[2].confirmed_bytes == 0);
}

TEST_CASE("tmpfs: O_DIRECT when the kernel offers it (Linux 6.6+), else UNSUPPORTED; allow_buffered always works") {
  auto fs = make_fs(FilesystemType::TMPFS);
  const auto path = fs->path("kv");
  write_pattern_file(path, 8192, 4);
  auto t = file::FileResolver{}.resolve("file://" + path, {});
  if (t.is_ok()) {
    CHECK(t->direct);
    CHECK(t->filesystem == "tmpfs");
    round_trip(path, {.writable = true});
  } else {
    CHECK(t.code() == StatusCode::UNSUPPORTED);
    CHECK(t.status().message().find("tmpfs") != std::string::npos);
  }
  auto b = file::FileResolver{}.resolve("file://" + path, {.allow_buffered = true});
  REQUIRE(b.is_ok());
  round_trip(path, {.writable = true, .allow_buffered = true});
}

TEST_CASE("ramfs has no O_DIRECT: UNSUPPORTED naming the file system, and allow_buffered works explicitly") {
  Mount ramfs("ramfs");
  const auto path = ramfs.path + "/kv";
  write_pattern_file(path, 8192, 5);
  UringRuntime runtime = require_ok(make_uring_runtime());
  auto refused = runtime.open("file://" + path);
  REQUIRE(refused.code() == StatusCode::UNSUPPORTED);
  CHECK(refused.status().message().find("ramfs") != std::string::npos);
  CHECK(refused.status().message().find(path) != std::string::npos);
  CHECK(refused.status().message().find("allow_buffered") != std::string::npos);
  auto t = file::FileResolver{}.resolve("file://" + path, {.allow_buffered = true});
  REQUIRE(t.is_ok());
  CHECK_FALSE(t->direct);
  CHECK(t->alignment_source == file::AlignmentSource::buffered);
  round_trip(path, {.writable = true, .allow_buffered = true});
}

TEST_CASE("a file on a read-only mount opened for writing fails naming the path and the errno") {
  auto fs = make_fs(FilesystemType::EXT4);
  const auto path = fs->path("ro");
  write_pattern_file(path, 4096, 6);
  REQUIRE(run_command(fmt::format("mount -o remount,ro {}", fs->mount_point())).is_ok());
  UringRuntime runtime = require_ok(make_uring_runtime());
  auto w = runtime.open("file://" + path, {.writable = true});
  REQUIRE(w.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(w.status().message().find(path) != std::string::npos);
  CHECK(w.status().message().find("Read-only file system (EROFS)") != std::string::npos);
  auto r = runtime.open("file://" + path);
  CHECK(r.is_ok());
  CHECK(runtime.close(*r).is_ok());
  REQUIRE(run_command(fmt::format("mount -o remount,rw {}", fs->mount_point())).is_ok());
}

TEST_CASE("without /proc a tail WRITE is rejected naming the saved cause (ENOENT), at open it still succeeds") {
  TempDirectory dir;
  const std::string path = dir.file("no-proc");
  write_pattern_file(path, 2 * 4096 + 100, 8);
  const pid_t child = ::fork();  // no thread exists yet; the child gets its own mount namespace
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::umount2("/proc", MNT_DETACH) != 0)
      ::_exit(10);
    auto runtime = make_uring_runtime();
    if (!runtime) ::_exit(11);
    auto target = runtime->open("file://" + path, {.writable = true});
    if (!target) {
      std::fprintf(stderr, "open: %s\n", target.status().to_string().c_str());
      ::_exit(12);
    }
    AlignedBuffer data(4096);
    auto memory = runtime->register_memory(data.view());
    if (!memory) ::_exit(13);
    const std::vector<IoRequest> tail{{Direction::WRITE, *memory, 0, *target, 2 * 4096, 100}};
    auto outcome = runtime->submit(tail);
    const Status& refused = outcome.initial_states[0];
    std::fprintf(stderr, "tail WRITE: %s\n", refused.to_string().c_str());
    if (refused.code() != StatusCode::INVALID_ARGUMENT) ::_exit(14);
    if (refused.message().find("No such file or directory (ENOENT)") == std::string::npos ||
        refused.message().find("/proc/self/fd/") == std::string::npos)
      ::_exit(15);
    const std::vector<IoRequest> aligned{{Direction::WRITE, *memory, 0, *target, 0, 4096}};
    auto written = runtime->submit(aligned);
    if (written.accepted != 1) ::_exit(16);
    auto result = runtime->wait(written.io, 30 * kSecond);
    ::_exit(result && result->status.is_ok() ? 0 : 17);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK_MESSAGE(WEXITSTATUS(status) == 0, "child step ", WEXITSTATUS(status), " failed (10: could not unmount /proc)");
}
