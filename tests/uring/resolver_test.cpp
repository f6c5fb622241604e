// file:// resolution, the tail descriptor and the pinned defaults of the uring DataPath (the errno table
// itself: tests/core/errno_test.cpp).
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "uring_test_support.hpp"

using namespace tutti;
using namespace tutti::testing;

TEST_CASE("uring options have the documented defaults") {
  uring::Options o;
  CHECK(o.queue_depth == 256);
  CHECK(o.sqpoll == false);
  CHECK(o.sqpoll_idle_ms == 1000);
  CHECK(o.registered_files == 256);
  CHECK(o.fixed_buffers == 64);
  CHECK(o.max_command_bytes == (1u << 20));
  CHECK(o.wait_slice_ns == 1'000'000);
  CHECK(o.staging_buffers == 8);
  CHECK(o.staging_buffer_bytes == (4u << 20));
  CHECK(o.drain_timeout_ns == 5'000'000'000ull);
  CHECK(o.close_flush_timeout_ns == 30'000'000'000ull);
  constexpr Capabilities caps = uring::UringDataPath::capabilities;
  CHECK(caps.offset_alignment == 4096);
  CHECK(caps.memory_alignment == 4096);
  CHECK(caps.max_request_bytes == (64u << 20));
  CHECK(caps.max_batch_requests == 8192);
  CHECK(caps.unaligned_tail_at_end_of_target);
  CHECK(caps.memory_kinds.contains(MemoryKind::HOST));
  CHECK(caps.memory_kinds.contains(MemoryKind::PINNED_HOST));
#if !defined(TUTTI_ACCELERATOR_CUDA)
  CHECK_FALSE(caps.memory_kinds.contains(MemoryKind::DEVICE));
#endif
}

TEST_CASE("options come from TUTTI_URING_* environment variables, and bad values name the variable") {
  ::setenv("TUTTI_URING_QUEUE_DEPTH", "64", 1);
  ::setenv("TUTTI_URING_SQPOLL", "1", 1);
  auto o = uring::Options::from_environment();
  REQUIRE(o.is_ok());
  CHECK(o->queue_depth == 64);
  CHECK(o->sqpoll);
  CHECK(o->fixed_buffers == uring::Options::kDefaultFixedBuffers);
  ::setenv("TUTTI_URING_QUEUE_DEPTH", "lots", 1);
  auto bad = uring::Options::from_environment();
  CHECK(bad.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(bad.status().message().find("TUTTI_URING_QUEUE_DEPTH") != std::string::npos);
  ::unsetenv("TUTTI_URING_QUEUE_DEPTH");
  ::unsetenv("TUTTI_URING_SQPOLL");
}

TEST_CASE("options are normalised: queue depth clamped, command size big enough for the largest request") {
  uring::UringDataPath d =
      require_ok(uring::UringDataPath::create(uring::Options{.queue_depth = 0, .max_command_bytes = 1000}));
  CHECK(d.options().queue_depth == 1);
  CHECK(d.options().max_command_bytes == (64u << 20));
  uring::UringDataPath e =
      require_ok(uring::UringDataPath::create(uring::Options{.queue_depth = 16, .max_command_bytes = 1000}));
  CHECK(e.options().max_command_bytes == (4u << 20));
}

TEST_CASE("bad file URIs are refused with messages that say why") {
  file::FileResolver resolver;
  auto code = [&](const std::string& uri) { return resolver.resolve(uri, {}).code(); };
  CHECK(code("") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("/etc/hostname") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("memfs://a") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("file://otherhost/etc/hostname") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("file:///etc/hostname?direct=0") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("file:///") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("file:///a%zz") == StatusCode::INVALID_ARGUMENT);
  CHECK(code("file:///nonexistent/tutti-no-such-file") == StatusCode::NOT_FOUND);
  auto missing = resolver.resolve("file:///nonexistent/tutti-no-such-file", {});
  CHECK(missing.status().message().find("/nonexistent/tutti-no-such-file") != std::string::npos);
  CHECK(missing.status().message().find("No such file or directory (ENOENT)") != std::string::npos);
  auto host = resolver.resolve("file://otherhost/x", {});
  CHECK(host.status().message().find("otherhost") != std::string::npos);
}

TEST_CASE("only regular files resolve; a FIFO is refused without blocking") {
  TempDirectory dir;
  file::FileResolver resolver;
  auto d = resolver.resolve("file://" + dir.path, {});
  CHECK(d.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(d.status().message().find("not a regular file") != std::string::npos);
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(resolver.resolve("file://" + fifo, {}).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(resolver.resolve("file:///dev/null", {}).code() == StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("a file on ext4 resolves with O_DIRECT, its size and its alignment; localhost and percent-encoding work") {
  TempDirectory dir;
  const std::string path = dir.file("with space");
  write_pattern_file(path, 12345, 1);
  file::FileResolver resolver;
  auto t = resolver.resolve("file://localhost" + dir.path + "/with%20space", {});
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  CHECK(t->path == path);
  CHECK(t->size_bytes() == 12345);
  CHECK(t->fd.valid());
  CHECK_FALSE(t->writable);
  CHECK_FALSE(t->tail_fd.valid());
  if (t->direct) {
    CHECK(t->direct_io_alignment >= 512);
    CHECK(t->direct_io_alignment <= 4096);
    CHECK(t->alignment_source != file::AlignmentSource::buffered);
  }
  MESSAGE("file system ", t->filesystem, ", direct ", t->direct, ", alignment ", t->direct_io_alignment, " from ",
          file::to_string(t->alignment_source));
  auto w = resolver.resolve("file://" + dir.path + "/with%20space", {.writable = true});
  REQUIRE_MESSAGE(w.is_ok(), w.status().to_string());
  CHECK(w->writable);
  if (w->direct) CHECK(w->tail_fd.valid());
}

namespace {

/// Lowers RLIMIT_NOFILE so that exactly `free` more descriptors can be opened; restores it when destroyed.
struct DescriptorLimit {
  explicit DescriptorLimit(int free) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    const int lowest = ::dup(0);  // the lowest free descriptor: the next open gets it
    REQUIRE(lowest >= 0);
    ::close(lowest);
    rlimit lowered = saved;
    lowered.rlim_cur = static_cast<rlim_t>(lowest + free);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  }
  ~DescriptorLimit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
  rlimit saved{};
};

}  // namespace

TEST_CASE("an open that cannot get its tail descriptor (EMFILE) fails RESOURCE_EXHAUSTED with the real errno") {
  TempDirectory dir;
  const std::string path = dir.file("tail");
  write_pattern_file(path, 3 * 4096 + 100, 2);
  file::FileResolver resolver;
  {
    auto probe = resolver.resolve("file://" + path, {.writable = true});
    REQUIRE_MESSAGE(probe.is_ok(), probe.status().to_string());
    if (!probe->direct) {
      MESSAGE("no O_DIRECT on ", probe->filesystem, " here: no tail descriptor to miss");
      return;
    }
  }
  Result<file::Target> opened = Status(StatusCode::INTERNAL, "not run");
  {
    DescriptorLimit limit(1);  // the file's descriptor fits, its tail descriptor does not
    opened = resolver.resolve("file://" + path, {.writable = true});
  }
  REQUIRE(opened.code() == StatusCode::RESOURCE_EXHAUSTED);
  const std::string message = opened.status().message();  // a copy: status() returns a temporary
  CHECK(message.find("Too many open files (EMFILE)") != std::string::npos);
  CHECK(message.find("tail descriptor of '" + path + "'") != std::string::npos);
  CHECK(message.find("/proc not mounted") == std::string::npos);
  // With a descriptor to spare the same open succeeds and the tail WRITE runs.
  UringRuntime runtime = require_ok(make_uring_runtime());
  auto target = runtime.open("file://" + path, {.writable = true});
  REQUIRE_MESSAGE(target.is_ok(), target.status().to_string());
  AlignedBuffer data(4096);
  auto memory = require_ok(runtime.register_memory(data.view()));
  auto written = run_all(runtime, {{Direction::WRITE, memory, 0, *target, 3 * 4096, 100}});
  CHECK_MESSAGE(written[0].status.is_ok(), written[0].status.to_string());
  CHECK(file_size(path) == 3 * 4096 + 100);
}

TEST_CASE("DEVICE memory is unsupported by the host profile") {
#if !defined(TUTTI_ACCELERATOR_CUDA)
  uring::UringDataPath d = require_ok(uring::UringDataPath::create());
  AlignedBuffer b(4096);
  auto r = d.register_memory({b.get(), 4096, MemoryKind::DEVICE, 0});
  CHECK(r.code() == StatusCode::UNSUPPORTED);
  UringRuntime runtime = require_ok(make_uring_runtime());
  CHECK(runtime.register_memory({b.get(), 4096, MemoryKind::DEVICE, 0}).code() == StatusCode::UNSUPPORTED);
#endif
}
