// The namespaces' file systems (daemon/src/mounts.hpp) on real ext4 images and loop devices: mounted when
// nothing is there and released at stop, verified when something is, refused with the key path when it is
// the wrong thing, and a busy mount point unmounted lazily within the timeout; tuttid itself with a namespace
// it cannot mount: the controller failed, the error in `devices`, leases refused. Needs root (loop devices and
// mounts); the suite is skipped with 77 otherwise.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>

#include "daemon_harness.hpp"
#include "mounts.hpp"

namespace fs = std::filesystem;
using tutti::StatusCode;
using tutti::daemon::MountRequest;
using tutti::daemon::NamespaceMount;

namespace {

/// A fresh folder with an ext4 image (`image`, 64 MiB) and a mount point path (`mnt`, not created).
struct Scratch {
  fs::path dir, image, mnt;
  Scratch() {
    dir = fs::temp_directory_path() / fmt::format("tutti-mounts-{}-{}", ::getpid(), counter()++);
    fs::create_directories(dir);
    image = dir / "ns.img";
    mnt = dir / "mnt";
    REQUIRE(run(fmt::format("truncate -s 64M '{}' && mkfs.ext4 -q -F -b 4096 '{}'", image.string(), image.string())));
  }
  ~Scratch() {
    // Whatever a failed check left: unmounted and detached before the folder goes.
    for (int i = 0; i < 3 && mounted(mnt.string()); ++i) ::umount2(mnt.c_str(), MNT_DETACH);
    run(fmt::format("losetup -j '{}' | cut -d: -f1 | xargs -r -n1 losetup -d", image.string()));
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  MountRequest request() const {
    return {.key = "controllers[0].namespaces[0]",
            .nsid = 1,
            .mount_point = mnt.string(),
            .filesystem = "ext4",
            .source = image.string(),
            .source_key = "controllers[0].soft.image",
            .timeout_ns = 2'000'000'000};
  }
  static bool run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }
  /// Whether `path` is a mount point, from /proc/self/mounts.
  static bool mounted(const std::string& path) {
    std::ifstream in("/proc/self/mounts");
    std::string device, point, rest;
    while (in >> device >> point && std::getline(in, rest))
      if (point == path) return true;
    return false;
  }
  /// The loop devices `image` is attached to, as losetup lists them (empty: none).
  std::string loops() const { return loops_of(image); }
  static std::string loops_of(const fs::path& file) {
    std::string out;
    if (FILE* p = ::popen(fmt::format("losetup -j '{}'", file.string()).c_str(), "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, p)) out += line;
      ::pclose(p);
    }
    return out;
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

}  // namespace

TEST_CASE("nothing mounted: the image is loop-attached read-write and mounted, and release unmounts and detaches") {
  Scratch s;
  auto m = NamespaceMount::mount_or_verify(s.request());
  REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
  CHECK(m->state() == "mounted");
  CHECK(m->block_device().starts_with("/dev/loop"));
  CHECK(m->mount_point() == s.mnt.string());
  CHECK(Scratch::mounted(s.mnt.string()));
  CHECK(s.loops().find(m->block_device() + ":") != std::string::npos);
  // Read-write, and files on it have the reported device number.
  { std::ofstream(s.mnt / "probe") << "written"; }
  struct stat st {};
  REQUIRE(::stat((s.mnt / "probe").c_str(), &st) == 0);
  CHECK(st.st_dev == m->device());
  const tutti::Status released = m->release();
  CHECK_MESSAGE(released.is_ok(), released.to_string());
  CHECK_FALSE(Scratch::mounted(s.mnt.string()));
  CHECK(s.loops().empty());
  CHECK(m->release().is_ok());  // twice: nothing left to do
  // What was written went to the image: mounted again, the file is there.
  auto again = NamespaceMount::mount_or_verify(s.request());
  REQUIRE_MESSAGE(again.is_ok(), again.status().to_string());
  std::string text;
  std::ifstream(s.mnt / "probe") >> text;
  CHECK(text == "written");
}

TEST_CASE("a mount of the image's loop device made by someone else is verified and left mounted at release") {
  Scratch s;
  fs::create_directories(s.mnt);
  REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", s.image.string(), s.mnt.string())));
  {
    auto m = NamespaceMount::mount_or_verify(s.request());
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    CHECK(m->state() == "verified");
    CHECK(m->block_device().starts_with("/dev/loop"));
    CHECK(m->release().is_ok());
  }  // and destroyed
  CHECK(Scratch::mounted(s.mnt.string()));
  CHECK_FALSE(s.loops().empty());
}

TEST_CASE("a mount point holding the wrong thing is refused with the key path, the value and what was expected") {
  Scratch s;
  fs::create_directories(s.mnt);
  SUBCASE("another image's file system") {
    Scratch other;
    REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", other.image.string(), s.mnt.string())));
    auto m = NamespaceMount::mount_or_verify(s.request());
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.code() == StatusCode::INVALID_ARGUMENT);
    const std::string text = m.status().message();
    INFO(text);
    CHECK(text.find("controllers[0].namespaces[0].mount") != std::string::npos);
    CHECK(text.find(other.image.string()) != std::string::npos);  // the backing file found
    CHECK(text.find("controllers[0].soft.image '" + s.image.string() + "'") != std::string::npos);
    ::umount2(s.mnt.c_str(), 0);
  }
  SUBCASE("a tmpfs") {
    REQUIRE(::mount("tmpfs", s.mnt.c_str(), "tmpfs", 0, nullptr) == 0);
    auto m = NamespaceMount::mount_or_verify(s.request());
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().message().find("is mounted as tmpfs") != std::string::npos);
    ::umount2(s.mnt.c_str(), 0);
  }
  SUBCASE("the image's file system, of another type than configured") {
    REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", s.image.string(), s.mnt.string())));
    MountRequest r = s.request();
    r.filesystem = "xfs";
    auto m = NamespaceMount::mount_or_verify(r);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().message().find("controllers[0].namespaces[0].filesystem: \"xfs\", but") != std::string::npos);
    ::umount2(s.mnt.c_str(), 0);
  }
  SUBCASE("an image without a file system: the mount fails, and the loop device is detached again") {
    REQUIRE(
        Scratch::run(fmt::format("truncate -s 0 '{}' && truncate -s 16M '{}'", s.image.string(), s.image.string())));
    auto m = NamespaceMount::mount_or_verify(s.request());
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.code() == StatusCode::DEVICE_ERROR);
    CHECK(m.status().message().find("is there an ext4 file system on it?") != std::string::npos);
    CHECK_FALSE(Scratch::mounted(s.mnt.string()));
    CHECK(s.loops().empty());
  }
  SUBCASE("no bound on the waits, or a relative mount point") {
    MountRequest r = s.request();
    r.timeout_ns = 0;
    auto m = NamespaceMount::mount_or_verify(r);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().message().find("MountRequest::timeout_ns = 0") != std::string::npos);
    r = s.request();
    r.mount_point = "mnt";
    m = NamespaceMount::mount_or_verify(r);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().message().find("controllers[0].namespaces[0].mount: 'mnt' is not an absolute path") !=
          std::string::npos);
  }
  SUBCASE("an image that is not there") {
    MountRequest r = s.request();
    r.source = (s.dir / "missing.img").string();
    auto m = NamespaceMount::mount_or_verify(r);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.code() == StatusCode::NOT_FOUND);
    CHECK(m.status().message().find("controllers[0].soft.image: '" + r.source + "'") != std::string::npos);
  }
}

TEST_CASE("a mount point kept busy past the timeout is unmounted lazily, and its loop device goes with its last file") {
  Scratch s;
  MountRequest r = s.request();
  r.timeout_ns = 200'000'000;
  auto m = NamespaceMount::mount_or_verify(r);
  REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
  const int busy = ::open((s.mnt / "held").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(busy >= 0);
  const std::uint64_t t0 = tutti::monotonic_ns();
  const tutti::Status released = m->release();
  CHECK(tutti::monotonic_ns() - t0 < 10'000'000'000ull);  // bounded (generous: a loaded machine)
  CHECK(released.code() == StatusCode::TIMEOUT);
  CHECK(released.message().find("unmounted lazily") != std::string::npos);
  CHECK_FALSE(Scratch::mounted(s.mnt.string()));
  ::close(busy);
  const std::uint64_t deadline = tutti::deadline_after_ns(10'000'000'000ull);
  while (!s.loops().empty() && tutti::remaining_ns(deadline) > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(s.loops().empty());
}

TEST_CASE(
    "tuttid with a namespace it cannot mount: the controller is failed with the key path, and leases are refused") {
  using namespace tutti::daemon::testing;
  const fs::path mount_point = fs::temp_directory_path() / fmt::format("tutti-mounts-failed-{}", ::getpid());
  // The harness's image holds no file system (16 MiB of zeros): mounting it as ext4 fails.
  TestDaemon d(
      fmt::format(R"("namespaces": [{{"nsid": 1, "mount": "{}", "filesystem": "ext4"}}])", mount_point.string()));
  const json devices = d.call({{"tutti", 1}, {"op", "devices"}});
  INFO(devices.dump());
  REQUIRE(devices["devices"].size() == 1);
  const json& device = devices["devices"][0];
  CHECK(device["state"] == "failed");
  const std::string why = device["error"];
  CHECK(why.find("controllers[0].namespaces[0].mount: mount -t ext4 /dev/loop") != std::string::npos);
  CHECK(why.find("is there an ext4 file system on it?") != std::string::npos);
  CHECK_FALSE(device["namespaces"][0].contains("block_device"));
  CHECK_FALSE(Scratch::mounted(mount_point.string()));
  const json refused = d.call(acquire_request(1));
  CHECK(refused["ok"] == false);
  CHECK(refused["error"]["code"] == "unavailable");
  CHECK(d.log_text().find("controller soft0 failed: DEVICE_ERROR: controllers[0].namespaces[0].mount") !=
        std::string::npos);
  // The loop device tuttid attached for the failed mount is detached again.
  CHECK(Scratch::loops_of(d.dir() / "soft0.img").empty());
  std::error_code ec;
  fs::remove_all(mount_point, ec);
}
