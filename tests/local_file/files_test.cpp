// local_file resolver on real file systems (root): ext4 images on loop devices, tmpfs.
// Each resolved extent is checked against the image: the bytes at the extent's device offset in
// the image (the namespace) equal the bytes the file system returns for the file.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

#include <doctest/doctest.h>

#include <scratch_filesystem.hpp>
#include <tutti/resolve/local_file.hpp>

#include "test_files.hpp"

using namespace tutti;
using tutti::testing::FilesystemType;
using tutti::testing::ScratchFilesystem;

namespace {

std::unique_ptr<ScratchFilesystem> make_ext4(std::uint64_t size = 256ull << 20, std::uint32_t sector = 512,
                                             std::uint32_t block = 4096) {
  ScratchFilesystem::Options o;
  o.type = FilesystemType::EXT4;
  o.size_bytes = size;
  o.block_size = block;
  o.sector_size = sector;
  auto fs = ScratchFilesystem::create(o);
  REQUIRE_MESSAGE(fs.is_ok(), fs.status().to_string());
  return std::move(fs.value());
}

local_file::LocalFileResolver resolver_for(const ScratchFilesystem& fs, std::uint32_t lba_size = 4096) {
  local_file::LocalFileResolver::Options o;
  o.block_device_path = fs.loop_device();
  o.partition_start_bytes = 0;
  o.lba_size = lba_size;
  auto r = local_file::LocalFileResolver::create(o);
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  return std::move(r.value());
}

/// Every byte of the file [0, size) read from the image at the extents' device offsets equals
/// what the file system returns.
void check_extents_against_image(const ScratchFilesystem& fs, const local_file::Target& t) {
  REQUIRE(t.validate().is_ok());
  const int image = ::open(fs.image_path().c_str(), O_RDONLY);
  REQUIRE(image >= 0);
  for (const auto& e : t.extents) {
    const std::uint64_t end = std::min(e.file_end(), t.file_size);
    for (std::uint64_t at = e.file_offset; at < end;) {
      const std::uint64_t n = std::min<std::uint64_t>(end - at, 4 << 20);
      std::vector<std::uint8_t> from_image(n);
      REQUIRE(::pread(image, from_image.data(), n, static_cast<off_t>(e.device_offset + (at - e.file_offset))) ==
              static_cast<ssize_t>(n));
      auto from_fs = tutti::testing::read_file(t.path, at, n);
      REQUIRE_MESSAGE(from_image == from_fs, "mismatch in extent at file offset ", e.file_offset);
      at += n;
    }
  }
  ::close(image);
}

}  // namespace

TEST_CASE("a small file resolves to one extent whose bytes on the device are the file's bytes") {
  auto fs = make_ext4();
  ScratchFilesystem::drop_caches().is_ok();
  const std::string path = fs->path("single");
  tutti::testing::write_pattern_file(path, 1, 64 * 4096);
  auto r = resolver_for(*fs).resolve("file://" + path, {});
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  CHECK(r->extents.size() == 1);
  CHECK(r->file_size == 64u * 4096);
  CHECK(r->lease.valid());
  CHECK(r->nsid == 1);
  CHECK((fcntl(r->lease.get(), F_GETFL) & O_DIRECT) != 0);
  check_extents_against_image(*fs, *r);
}

TEST_CASE("interleaved appends of two files give many extents, all resolved and sorted") {
  auto fs = make_ext4();
  const std::string a = fs->path("a"), b = fs->path("b");
  for (int i = 0; i < 200; ++i) {
    tutti::testing::append_pattern(a, 2, std::uint64_t(i) * 8192, 8192);
    tutti::testing::append_pattern(b, 3, std::uint64_t(i) * 4096, 4096);
  }
  auto ra = resolver_for(*fs).resolve("file://" + a, {});
  auto rb = resolver_for(*fs).resolve("file://" + b, {});
  REQUIRE_MESSAGE(ra.is_ok(), ra.status().to_string());
  REQUIRE(rb.is_ok());
  MESSAGE("extents: a=", ra->extents.size(), " b=", rb->extents.size());
  CHECK(ra->extents.size() > 1);
  CHECK(std::is_sorted(ra->extents.begin(), ra->extents.end(),
                       [](auto& x, auto& y) { return x.file_offset < y.file_offset; }));
  check_extents_against_image(*fs, *ra);
  check_extents_against_image(*fs, *rb);
}

TEST_CASE("sizes that are not multiples of 4096 resolve; the last extent covers the tail LBA") {
  auto fs = make_ext4();
  for (std::uint64_t size : {1ull, 4095ull, 4097ull, 100000ull, 3ull * 4096 + 1}) {
    const std::string path = fs->path(fmt::format("odd{}", size));
    tutti::testing::write_pattern_file(path, size, size);
    auto r = resolver_for(*fs).resolve("file://" + path, {});
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    CHECK(r->file_size == size);
    CHECK(r->extents.back().file_end() >= (size + 4095) / 4096 * 4096);
    check_extents_against_image(*fs, *r);
  }
  const std::string empty = fs->path("empty");
  tutti::testing::write_pattern_file(empty, 0, 0);
  auto r = resolver_for(*fs).resolve("file://" + empty, {});
  REQUIRE(r.is_ok());
  CHECK(r->extents.empty());
  CHECK(r->file_size == 0);
}

TEST_CASE("a 1 GiB sparse-then-filled file resolves without a cap on extent calls") {
  auto fs = make_ext4(1200ull << 20);
  const std::string path = fs->path("big");
  REQUIRE(tutti::testing::run_command(fmt::format("truncate -s 1G {}", path)).is_ok());
  auto sparse = resolver_for(*fs).resolve("file://" + path, {});
  CHECK(sparse.code() == StatusCode::DATA_LOSS);
  CHECK(sparse.status().message().find("file offset 0") != std::string::npos);
  REQUIRE(tutti::testing::run_command(fmt::format("dd if=/dev/zero of={} bs=8M count=128 conv=notrunc,fsync", path))
              .is_ok());
  auto r = resolver_for(*fs).resolve("file://" + path, {});
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  CHECK(r->file_size == (1ull << 30));
  MESSAGE("1 GiB file: ", r->extents.size(), " extents after merging");
  REQUIRE(r->validate().is_ok());
}

TEST_CASE("fail closed: preallocated, sparse and punched files are DATA_LOSS naming the file offset") {
  auto fs = make_ext4();
  auto resolver = resolver_for(*fs);

  const std::string prealloc = fs->path("prealloc");
  REQUIRE(tutti::testing::run_command(fmt::format("fallocate -l 1M {}", prealloc)).is_ok());
  auto r1 = resolver.resolve("file://" + prealloc, {});
  CHECK(r1.code() == StatusCode::DATA_LOSS);
  CHECK(r1.status().message().find("unwritten") != std::string::npos);
  CHECK(r1.status().message().find("file offset 0") != std::string::npos);

  // Written first half, preallocated second half.
  const std::string half = fs->path("half");
  tutti::testing::write_pattern_file(half, 5, 65536);
  REQUIRE(tutti::testing::run_command(fmt::format("fallocate -o 65536 -l 65536 {}", half)).is_ok());
  auto r2 = resolver.resolve("file://" + half, {});
  CHECK(r2.code() == StatusCode::DATA_LOSS);
  CHECK(r2.status().message().find("file offset 65536") != std::string::npos);

  const std::string sparse = fs->path("sparse");
  tutti::testing::write_pattern_file(sparse, 6, 8192);
  REQUIRE(tutti::testing::run_command(fmt::format("truncate -s 1M {}", sparse)).is_ok());
  auto r3 = resolver.resolve("file://" + sparse, {});
  CHECK(r3.code() == StatusCode::DATA_LOSS);
  CHECK(r3.status().message().find("file offset 8192") != std::string::npos);

  const std::string punched = fs->path("punched");
  tutti::testing::write_pattern_file(punched, 7, 1 << 20);
  REQUIRE(tutti::testing::run_command(fmt::format("fallocate -p -o 262144 -l 131072 {}", punched)).is_ok());
  auto r4 = resolver.resolve("file://" + punched, {});
  CHECK(r4.code() == StatusCode::DATA_LOSS);
  CHECK(r4.status().message().find("hole at file offset 262144") != std::string::npos);
}

TEST_CASE("fail closed: tmpfs files and files on another image are UNSUPPORTED; missing files NOT_FOUND") {
  auto fs = make_ext4();
  auto resolver = resolver_for(*fs);
  ScratchFilesystem::Options tmp_options;
  tmp_options.type = FilesystemType::TMPFS;
  tmp_options.size_bytes = 16 << 20;
  auto tmp = ScratchFilesystem::create(tmp_options);
  REQUIRE(tmp.is_ok());
  const std::string on_tmpfs = tmp.value()->path("f");
  tutti::testing::write_pattern_file(on_tmpfs, 8, 8192);
  auto r1 = resolver.resolve("file://" + on_tmpfs, {});
  CHECK(r1.code() == StatusCode::UNSUPPORTED);
  MESSAGE("tmpfs: ", r1.status().to_string());

  auto other = make_ext4(64 << 20);
  const std::string on_other = other->path("f");
  tutti::testing::write_pattern_file(on_other, 9, 8192);
  auto r2 = resolver.resolve("file://" + on_other, {});
  CHECK(r2.code() == StatusCode::UNSUPPORTED);
  CHECK(r2.status().message().find("not on the namespace's block device") != std::string::npos);

  CHECK(resolver.resolve("file://" + fs->path("missing"), {}).code() == StatusCode::NOT_FOUND);
  CHECK(resolver.resolve("file://" + fs->mount_point(), {}).code() == StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("fail closed: extents not aligned to the LBA size are UNSUPPORTED (1 KiB ext4 blocks, 4 KiB LBAs)") {
  auto fs = make_ext4(64 << 20, 512, 1024);
  bool saw_misaligned = false;
  for (int i = 0; i < 16 && !saw_misaligned; ++i) {
    const std::string path = fs->path(fmt::format("k{}", i));
    tutti::testing::write_pattern_file(path, 10 + i, 1024 * (1 + i % 3));
    auto r = resolver_for(*fs, 4096).resolve("file://" + path, {});
    if (!r.is_ok()) {
      CHECK(r.code() == StatusCode::UNSUPPORTED);
      CHECK(r.status().message().find("not aligned to the 4096-byte LBA size") != std::string::npos);
      saw_misaligned = true;
    }
  }
  CHECK(saw_misaligned);
  // The same files resolve with 512-byte LBAs.
  auto r = resolver_for(*fs, 512).resolve("file://" + fs->path("k0"), {});
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  check_extents_against_image(*fs, *r);
}

TEST_CASE("a 512-byte LBA format resolves files on a 512-byte-sector loop device") {
  auto fs = make_ext4(64 << 20, 512);
  const std::string path = fs->path("f512");
  tutti::testing::write_pattern_file(path, 11, 100001);
  auto r = resolver_for(*fs, 512).resolve("file://" + path, {});
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  CHECK(r->lba_size == 512);
  check_extents_against_image(*fs, *r);
}

TEST_CASE("every fsync policy resolves a freshly written (dirty, delayed-allocation) file to its bytes") {
  auto fs = make_ext4(64 << 20);
  for (auto policy :
       {local_file::FsyncPolicy::always, local_file::FsyncPolicy::writable_opens, local_file::FsyncPolicy::never}) {
    const std::string path = fs->path(fmt::format("dirty{}", static_cast<int>(policy)));
    {
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);  // no fsync: dirty pages
      REQUIRE(fd >= 0);
      auto bytes = tutti::testing::pattern(40, 0, 300000);
      REQUIRE(::write(fd, bytes.data(), bytes.size()) == 300000);
      ::close(fd);
    }
    local_file::LocalFileResolver::Options o;
    o.block_device_path = fs->loop_device();
    o.partition_start_bytes = 0;
    o.fsync_policy = policy;
    auto resolver = local_file::LocalFileResolver::create(o);
    REQUIRE(resolver.is_ok());
    auto r = resolver->resolve("file://" + path, {});
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    check_extents_against_image(*fs, *r);
  }
}

TEST_CASE("writable opens use O_RDWR; read-only opens O_RDONLY") {
  auto fs = make_ext4(64 << 20);
  const std::string path = fs->path("rw");
  tutti::testing::write_pattern_file(path, 12, 8192);
  auto ro = resolver_for(*fs).resolve("file://" + path, {});
  auto rw = resolver_for(*fs).resolve("file://" + path, OpenOptions{true, false, false});
  REQUIRE(ro.is_ok());
  REQUIRE_MESSAGE(rw.is_ok(), rw.status().to_string());
  CHECK((fcntl(ro->lease.get(), F_GETFL) & O_ACCMODE) == O_RDONLY);
  CHECK((fcntl(rw->lease.get(), F_GETFL) & O_ACCMODE) == O_RDWR);
  CHECK(rw->writable);
}

namespace {
bool immutable_flag(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  int flags = 0;
  const int rc = ::ioctl(fd, FS_IOC_GETFLAGS, &flags);
  ::close(fd);
  REQUIRE(rc == 0);
  return (flags & FS_IMMUTABLE_FL) != 0;
}
}  // namespace

TEST_CASE(
    "the change guard: a resolved file is immutable while its target lives (with CAP_LINUX_IMMUTABLE), "
    "watch_only leaves it mutable, and a target assigned over another releases the other's flag") {
  auto fs = make_ext4(64 << 20);
  const std::string a = fs->path("a"), b = fs->path("b"), c = fs->path("c");
  for (const std::string& path : {a, b, c}) tutti::testing::write_pattern_file(path, 13, 8192);
  auto resolver = resolver_for(*fs);
  auto ta = resolver.resolve("file://" + a, {});
  REQUIRE_MESSAGE(ta.is_ok(), ta.status().to_string());
  // Root in this suite has CAP_LINUX_IMMUTABLE; tests/local_nvme/changes_test.cpp covers a process without it.
  CHECK(ta->guard.immutable_owned());
  CHECK(ta->guard.watched());
  CHECK(immutable_flag(a));
  {
    auto tb = resolver.resolve("file://" + b, {});
    REQUIRE(tb.is_ok());
    CHECK(immutable_flag(b));
    // Member-wise move assignment closes a's lease before its guard is released: the flag must
    // still be cleared (the guard keeps its own descriptor for it), and b's must stay.
    *ta = std::move(*tb);
    CHECK_FALSE(immutable_flag(a));
    CHECK(immutable_flag(b));
  }
  CHECK(immutable_flag(b));  // held by ta now
  ta = error(StatusCode::INTERNAL, "drop");
  CHECK_FALSE(immutable_flag(b));

  local_file::LocalFileResolver::Options o = resolver.options();
  o.change_protection = local_file::ChangeProtection::watch_only;
  auto watching = local_file::LocalFileResolver::create(o);
  REQUIRE(watching.is_ok());
  auto tc = watching->resolve("file://" + c, {});
  REQUIRE(tc.is_ok());
  CHECK_FALSE(immutable_flag(c));
  CHECK(tc->guard.watched());
  CHECK_FALSE(tc->guard.changed());
  REQUIRE(::truncate(c.c_str(), 4096) == 0);
  local_file::poll_changes();
  CHECK(tc->guard.changed());
  CHECK(tc->guard.watch().what().find("IN_MODIFY") != std::string::npos);
}
