// One classification of open errors (tutti/core/errno.hpp) on both resolver paths: the same failure
// gives the same StatusCode, and a message with the errno text, through the uring runtime
// (file::FileResolver) and the local_nvme runtime (local_file::LocalFileResolver, a soft controller
// on the same ext4 loop image). Root only (loop image, mounts, a child that drops to nobody).
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include <real_files.hpp>
#include <require_ok.hpp>
#include <scratch_filesystem.hpp>
#include <tutti/libnvm/soft_local_nvme.hpp>
#include <tutti/presets/uring.hpp>

using namespace tutti;
using tutti::testing::FilesystemType;
using tutti::testing::require_ok;
using tutti::testing::run_command;
using tutti::testing::ScratchFilesystem;

namespace {

std::unique_ptr<ScratchFilesystem> make_ext4() {
  auto fs = ScratchFilesystem::create({.type = FilesystemType::EXT4, .size_bytes = std::uint64_t{64} << 20});
  REQUIRE_MESSAGE(fs.is_ok(), fs.status().to_string());
  return std::move(fs.value());
}

void write_file(const std::string& path, std::size_t bytes = 8192) {
  std::FILE* out = std::fopen(path.c_str(), "w");
  REQUIRE(out != nullptr);
  const std::string data(bytes, 'k');
  REQUIRE(std::fwrite(data.data(), 1, data.size(), out) == data.size());
  REQUIRE(std::fclose(out) == 0);
}

local_file::LocalFileResolver local_resolver(const ScratchFilesystem& fs) {
  local_file::LocalFileResolver::Options o;
  o.block_device_path = fs.loop_device();
  o.partition_start_bytes = 0;
  return require_ok(local_file::LocalFileResolver::create(o));
}

/// Both runtimes over one ext4 image: uring, and local_nvme through a soft controller backed by it.
struct Backends {
  explicit Backends(const ScratchFilesystem& fs) {
    SoftLocalNvmeOptions o;
    o.backing_path = fs.image_path();
    o.block_device_path = fs.loop_device();
    o.soft.worker_threads = 1;
    o.datapath.queue_pairs = 1;
    nvme = require_ok(make_soft_local_nvme(o));
  }
  Status open_uring(const std::string& path, bool writable = false) {
    auto t = uring.open("file://" + path, {.writable = writable});
    if (t) (void)uring.close(*t);
    return t.status();
  }
  Status open_nvme(const std::string& path, bool writable = false) {
    auto t = nvme->runtime->open("file://" + path, {.writable = writable});
    if (t) (void)nvme->runtime->close(*t);
    return t.status();
  }
  UringRuntime uring = require_ok(make_uring_runtime());
  std::unique_ptr<SoftLocalNvme> nvme;
};

/// Both backends fail with `code` and a message holding `text`.
void check_both(Backends& b, const std::string& path, bool writable, StatusCode code, const std::string& text) {
  for (const Status& s : {b.open_uring(path, writable), b.open_nvme(path, writable)}) {
    CHECK_MESSAGE(s.code() == code, s.to_string());
    CHECK_MESSAGE(s.message().find(text) != std::string::npos, s.to_string());
  }
}

/// Lowers RLIMIT_NOFILE so that no more descriptor can be opened; restores it when destroyed.
struct NoFreeDescriptor {
  NoFreeDescriptor() {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    const int lowest = ::dup(0);
    REQUIRE(lowest >= 0);
    ::close(lowest);
    rlimit lowered = saved;
    lowered.rlim_cur = static_cast<rlim_t>(lowest);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  }
  ~NoFreeDescriptor() { ::setrlimit(RLIMIT_NOFILE, &saved); }
  rlimit saved{};
};

}  // namespace

TEST_CASE("a read-only file system (EROFS) is INVALID_ARGUMENT on both backends, naming the errno") {
  auto fs = make_ext4();
  const std::string path = fs->path("ro");
  write_file(path);
  Backends b(*fs);
  REQUIRE(run_command(fmt::format("mount -o remount,ro {}", fs->mount_point())).is_ok());
  check_both(b, path, true, StatusCode::INVALID_ARGUMENT, "Read-only file system (EROFS)");
  CHECK(b.open_uring(path).is_ok());  // reading still works
  CHECK(b.open_nvme(path).is_ok());
  REQUIRE(run_command(fmt::format("mount -o remount,rw {}", fs->mount_point())).is_ok());
}

TEST_CASE("a missing file (ENOENT) and a path through a regular file (ENOTDIR) are NOT_FOUND on both backends") {
  auto fs = make_ext4();
  const std::string file = fs->path("plain");
  write_file(file);
  Backends b(*fs);
  check_both(b, fs->path("missing"), false, StatusCode::NOT_FOUND, "No such file or directory (ENOENT)");
  check_both(b, file + "/below", false, StatusCode::NOT_FOUND, "Not a directory (ENOTDIR)");
}

TEST_CASE("a symlink loop (ELOOP), a name too long (ENAMETOOLONG) and a directory are INVALID_ARGUMENT on both") {
  auto fs = make_ext4();
  Backends b(*fs);
  const std::string a = fs->path("loop-a"), c = fs->path("loop-b");
  REQUIRE(::symlink(c.c_str(), a.c_str()) == 0);
  REQUIRE(::symlink(a.c_str(), c.c_str()) == 0);
  check_both(b, a, false, StatusCode::INVALID_ARGUMENT, "(ELOOP)");
  check_both(b, fs->path(std::string(300, 'n')), false, StatusCode::INVALID_ARGUMENT,
             "File name too long (ENAMETOOLONG)");
  const std::string directory = fs->path("directory");
  REQUIRE(::mkdir(directory.c_str(), 0755) == 0);
  check_both(b, directory, true, StatusCode::INVALID_ARGUMENT, "not a regular file");
}

TEST_CASE("no descriptor left (EMFILE) is RESOURCE_EXHAUSTED on both backends") {
  auto fs = make_ext4();
  const std::string path = fs->path("many");
  write_file(path);
  Backends b(*fs);
  Status uring_status, nvme_status;
  {
    NoFreeDescriptor limit;
    uring_status = b.open_uring(path);
    nvme_status = b.open_nvme(path);
  }
  for (const Status& s : {uring_status, nvme_status}) {
    CHECK_MESSAGE(s.code() == StatusCode::RESOURCE_EXHAUSTED, s.to_string());
    CHECK_MESSAGE(s.message().find("Too many open files (EMFILE)") != std::string::npos, s.to_string());
  }
}

TEST_CASE("a file system without O_DIRECT (ramfs) is UNSUPPORTED on both resolvers") {
  auto fs = make_ext4();
  const std::string mount = fs->path("ramfs");
  REQUIRE(::mkdir(mount.c_str(), 0755) == 0);
  REQUIRE(run_command(fmt::format("mount -t ramfs ramfs {}", mount)).is_ok());
  write_file(mount + "/kv");
  auto uring = file::FileResolver{}.resolve("file://" + mount + "/kv", {});
  auto local = local_resolver(*fs).resolve("file://" + mount + "/kv", {});
  CHECK_MESSAGE(uring.code() == StatusCode::UNSUPPORTED, uring.status().to_string());
  CHECK_MESSAGE(local.code() == StatusCode::UNSUPPORTED, local.status().to_string());
  REQUIRE(run_command(fmt::format("umount {}", mount)).is_ok());
}

TEST_CASE("permission denied (EACCES, in a child that runs as nobody) is INVALID_ARGUMENT on both resolvers") {
  auto fs = make_ext4();
  const std::string path = fs->path("secret");
  write_file(path);
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  // nobody may walk to the mount point; the file's own permissions refuse it.
  REQUIRE(::chmod(std::filesystem::path(fs->mount_point()).parent_path().c_str(), 0755) == 0);
  const local_file::LocalFileResolver local = local_resolver(*fs);
  int answer[2];
  REQUIRE(::pipe(answer) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no runtime (no thread) exists yet: the child only calls the resolvers
    ::close(answer[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const auto u = file::FileResolver{}.resolve("file://" + path, {});
    const auto l = local.resolve("file://" + path, {});
    const std::string report = fmt::format("{} {}\n{}\n{}\n", static_cast<int>(u.code()), static_cast<int>(l.code()),
                                           u.status().message(), l.status().message());
    const bool written = ::write(answer[1], report.data(), report.size()) == static_cast<ssize_t>(report.size());
    ::_exit(written ? 0 : 3);
  }
  ::close(answer[1]);
  std::string report;
  char chunk[512];
  for (ssize_t n; (n = ::read(answer[0], chunk, sizeof chunk)) > 0;) report.append(chunk, static_cast<std::size_t>(n));
  ::close(answer[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the child failed (2: could not become nobody)");
  int uring_code = -1, local_code = -1;
  REQUIRE(std::sscanf(report.c_str(), "%d %d", &uring_code, &local_code) == 2);
  MESSAGE(report);
  CHECK(static_cast<StatusCode>(uring_code) == StatusCode::INVALID_ARGUMENT);
  CHECK(static_cast<StatusCode>(local_code) == StatusCode::INVALID_ARGUMENT);
  const std::size_t first = report.find("Permission denied (EACCES)");
  CHECK(first != std::string::npos);
  CHECK(report.find("Permission denied (EACCES)", first + 1) != std::string::npos);  // in both messages
}
