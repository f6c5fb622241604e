// The namespaces' file systems (daemon/src/mounts.hpp) on real ext4 images and loop devices: mounted when
// nothing is there and released at stop, verified when something is, refused with the key path when it is
// the wrong thing, and a busy mount point unmounted lazily within the timeout; tuttid itself with a namespace
// it cannot mount: the controller failed, the error in `devices`, leases refused. Needs root (loop devices and
// mounts); the suite is skipped with 77 otherwise.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
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
    // Whatever a failed check left: unmounted (anywhere under dir) and detached before the folder goes.
    for (const fs::path& point : {mnt, dir / "elsewhere"})
      for (int i = 0; i < 3 && mounted(point.string()); ++i) ::umount2(point.c_str(), MNT_DETACH);
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
  /// Whether `image` has no loop device within 5 s (a self-clearing one goes asynchronously).
  bool loops_gone() const {
    const std::uint64_t deadline = tutti::deadline_after_ns(5'000'000'000ull);
    while (!loops().empty() && tutti::remaining_ns(deadline) > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return loops().empty();
  }
  /// The message of mount_or_verify's refusal of `r`, checked to be INVALID_ARGUMENT.
  static std::string refusal(const MountRequest& r) {
    auto m = NamespaceMount::mount_or_verify(r);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.code() == StatusCode::INVALID_ARGUMENT);
    return m.status().message();
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

TEST_CASE("the loop device tuttid attached clears itself at unmount after tuttid was killed") {
  Scratch s;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // as tuttid: mounts, then dies without releasing
    auto m = NamespaceMount::mount_or_verify(s.request());
    ::kill(::getpid(), SIGKILL);
    ::_exit(1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(Scratch::mounted(s.mnt.string()));
  REQUIRE(::umount2(s.mnt.c_str(), 0) == 0);  // the admin
  CHECK(s.loops_gone());                      // LO_FLAGS_AUTOCLEAR
}

/// A block device standing for a PCI controller's namespace (/dev/snvmeXnY, which the snvme driver serves):
/// `image` attached to a loop device by the test itself, as the driver's disk exists before tuttid; detached
/// when it goes.
struct BlockDevice {
  std::string node;
  explicit BlockDevice(const fs::path& image) {
    if (FILE* p = ::popen(fmt::format("losetup -f --show '{}'", image.string()).c_str(), "r")) {
      char line[256] = {};
      if (std::fgets(line, sizeof line, p)) node = line;
      ::pclose(p);
    }
    while (!node.empty() && (node.back() == '\n' || node.back() == ' ')) node.pop_back();
    REQUIRE_MESSAGE(node.starts_with("/dev/loop"), (std::string("losetup -f --show: ") + node));
  }
  ~BlockDevice() { Scratch::run("losetup -d " + node); }
  /// The request of a PCI namespace: this device as the source.
  MountRequest request(const Scratch& s) const {
    MountRequest r = s.request();
    r.source = node;
    r.source_key = "controllers[0].pci_address 0000:00:04.0 namespace 1";
    return r;
  }
};

TEST_CASE(
    "a namespace's block device (a PCI controller's): mounted as it is, rechecked, released; one mounted before "
    "tuttid is verified and left") {
  Scratch s;
  const BlockDevice dev(s.image);
  SUBCASE("nothing there: mounted (noatime, nosuid, nodev), rechecked, unmounted at release; the device stays") {
    auto m = NamespaceMount::mount_or_verify(dev.request(s));
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    CHECK(m->state() == "mounted");
    CHECK(m->block_device() == dev.node);
    struct stat st {};
    REQUIRE(::stat(dev.node.c_str(), &st) == 0);
    CHECK(m->device() == st.st_rdev);
    struct statvfs flags {};
    REQUIRE(::statvfs(s.mnt.c_str(), &flags) == 0);
    CHECK((flags.f_flag & ST_NOATIME) != 0);
    CHECK((flags.f_flag & ST_NOSUID) != 0);
    CHECK((flags.f_flag & ST_NODEV) != 0);
    CHECK(m->recheck().is_ok());
    const tutti::Status released = m->release();
    CHECK_MESSAGE(released.is_ok(), released.to_string());
    CHECK_FALSE(Scratch::mounted(s.mnt.string()));
    CHECK(s.loops().find(dev.node + ":") != std::string::npos);  // not tuttid's to detach
  }
  SUBCASE("mounted before tuttid: verified, rechecked, left mounted at release") {
    fs::create_directories(s.mnt);
    REQUIRE(Scratch::run(fmt::format("mount -t ext4 {} '{}'", dev.node, s.mnt.string())));
    {
      auto m = NamespaceMount::mount_or_verify(dev.request(s));
      REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
      CHECK(m->state() == "verified");
      CHECK(m->block_device() == dev.node);
      CHECK(m->recheck().is_ok());
      CHECK(m->release().is_ok());
    }  // and destroyed
    CHECK(Scratch::mounted(s.mnt.string()));
    CHECK(::umount2(s.mnt.c_str(), 0) == 0);
  }
  SUBCASE("another device's file system there: refused, naming both devices and the key paths") {
    Scratch other;
    const BlockDevice elsewhere(other.image);
    fs::create_directories(s.mnt);
    REQUIRE(Scratch::run(fmt::format("mount -t ext4 {} '{}'", elsewhere.node, s.mnt.string())));
    const std::string text = Scratch::refusal(dev.request(s));
    INFO(text);
    CHECK(text.find("controllers[0].namespaces[0].mount: '" + s.mnt.string() + "' is mounted from " + elsewhere.node) !=
          std::string::npos);
    CHECK(text.find("not from controllers[0].pci_address 0000:00:04.0 namespace 1 '" + dev.node + "'") !=
          std::string::npos);
    CHECK(::umount2(s.mnt.c_str(), 0) == 0);
  }
  SUBCASE("swapped after bring-up: the recheck fails, naming what is there now") {
    Scratch other;
    const BlockDevice elsewhere(other.image);
    auto m = NamespaceMount::mount_or_verify(dev.request(s));
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    REQUIRE(::umount2(s.mnt.c_str(), 0) == 0);  // the admin
    REQUIRE(Scratch::run(fmt::format("mount -t ext4 {} '{}'", elsewhere.node, s.mnt.string())));
    const tutti::Status changed = m->recheck();
    INFO(changed.to_string());
    CHECK(changed.code() == StatusCode::INVALID_ARGUMENT);
    CHECK(changed.message().find("is now mounted from " + elsewhere.node) != std::string::npos);
    CHECK(changed.message().find("not from " + dev.node) != std::string::npos);
    const tutti::Status released = m->release();  // the admin's mount is not tuttid's: left, and said so
    CHECK(released.code() == StatusCode::DEVICE_ERROR);
    CHECK(released.message().find("not the mount tuttid made") != std::string::npos);
    CHECK(Scratch::mounted(s.mnt.string()));
    CHECK(::umount2(s.mnt.c_str(), 0) == 0);
  }
}

TEST_CASE("a mount swapped after bring-up fails the recheck, naming what is there now") {
  Scratch s, other;
  fs::create_directories(s.mnt);
  REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", s.image.string(), s.mnt.string())));
  auto m = NamespaceMount::mount_or_verify(s.request());
  REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
  CHECK(m->recheck().is_ok());
  REQUIRE(::umount2(s.mnt.c_str(), 0) == 0);
  SUBCASE("unmounted") {
    const tutti::Status changed = m->recheck();
    CHECK(changed.code() == StatusCode::INVALID_ARGUMENT);
    CHECK(changed.message().find("is no longer mounted, not from " + m->block_device()) != std::string::npos);
  }
  SUBCASE("another image mounted there") {
    REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", other.image.string(), s.mnt.string())));
    const tutti::Status changed = m->recheck();
    CHECK(changed.code() == StatusCode::INVALID_ARGUMENT);
    INFO(changed.message());
    CHECK(changed.message().find("controllers[0].namespaces[0].mount: '" + s.mnt.string() + "' is now mounted from") !=
          std::string::npos);
    ::umount2(s.mnt.c_str(), 0);
  }
  // The held descriptor kept the admin's self-clearing loop device attached: it goes with the release.
  CHECK_FALSE(s.loops().empty());
  CHECK(m->release().is_ok());
  CHECK(s.loops_gone());
}

TEST_CASE("tuttid refuses an acquire with unavailable once its mount was taken away, and devices says why") {
  using namespace tutti::daemon::testing;
  const fs::path mount_point = fs::temp_directory_path() / fmt::format("tutti-mounts-swapped-{}", ::getpid());
  TestDaemon d(
      fmt::format(R"("namespaces": [{{"nsid": 1, "mount": "{}", "filesystem": "ext4"}}])", mount_point.string()), "",
      400, 0, 64 << 20);
  REQUIRE(Scratch::mounted(mount_point.string()));
  REQUIRE(::umount2(mount_point.c_str(), 0) == 0);
  const json refused = d.call(acquire_request(1));
  INFO(refused.dump());
  CHECK(refused["ok"] == false);
  CHECK(refused["error"]["code"] == "unavailable");
  const std::string why = refused["error"]["message"];
  CHECK(why.find("controllers[0].namespaces[0].mount: '" + mount_point.string() + "' is no longer mounted") !=
        std::string::npos);
  const json devices = d.call({{"tutti", 1}, {"op", "devices"}});
  CHECK(devices["devices"][0]["state"] == "failed");
  CHECK(std::string(devices["devices"][0]["error"]).find("is no longer mounted") != std::string::npos);
  d.stop(SIGTERM);
  CHECK(Scratch::loops_of(d.dir() / "soft0.img").empty());
  std::error_code ec;
  fs::remove_all(mount_point, ec);
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

TEST_CASE("an image already attached to a loop device is never mounted a second time") {
  Scratch s;
  SUBCASE("loop-mounted elsewhere by the admin, the image named through a symlink: refused before attaching") {
    const fs::path elsewhere = s.dir / "elsewhere";
    fs::create_directories(elsewhere);
    REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", s.image.string(), elsewhere.string())));
    fs::create_symlink(s.image, s.dir / "link.img");
    MountRequest r = s.request();
    r.source = (s.dir / "link.img").string();
    const std::string text = Scratch::refusal(r);
    INFO(text);
    CHECK(text.find("controllers[0].soft.image '" + r.source + "' is already attached to /dev/loop") !=
          std::string::npos);
    CHECK(text.find("mounted at '" + elsewhere.string() + "'") != std::string::npos);
    CHECK_FALSE(Scratch::mounted(s.mnt.string()));
    CHECK(::umount2(elsewhere.c_str(), 0) == 0);
  }
  SUBCASE("the verified mount's image also attached to a second loop device: refused") {
    fs::create_directories(s.mnt);
    REQUIRE(Scratch::run(fmt::format("mount -o loop '{}' '{}'", s.image.string(), s.mnt.string())));
    REQUIRE(Scratch::run(fmt::format("losetup -f '{}'", s.image.string())));
    const std::string text = Scratch::refusal(s.request());
    INFO(text);
    CHECK(text.find("is already attached to /dev/loop") != std::string::npos);
    CHECK(text.find("not mounted") != std::string::npos);
    ::umount2(s.mnt.c_str(), 0);
  }
}

TEST_CASE("a loop device with an offset into the image is refused: the file system must start at its first byte") {
  Scratch s;
  fs::create_directories(s.mnt);
  REQUIRE(
      Scratch::run(fmt::format("truncate -s 0 '{}' && truncate -s 64M '{}' && mkfs.ext4 -q -F -b 4096 -E "
                               "offset=1048576 '{}' 32M",
                               s.image.string(), s.image.string(), s.image.string())));
  REQUIRE(Scratch::run(fmt::format("mount -o loop,offset=1048576 '{}' '{}'", s.image.string(), s.mnt.string())));
  const std::string text = Scratch::refusal(s.request());
  INFO(text);
  CHECK(text.find("controllers[0].namespaces[0].mount: '" + s.mnt.string() + "' is mounted from /dev/loop") !=
        std::string::npos);
  CHECK(text.find("starts at offset 1048576 of controllers[0].soft.image") != std::string::npos);
  CHECK(text.find("expected offset 0") != std::string::npos);
  CHECK(::umount2(s.mnt.c_str(), 0) == 0);
}

TEST_CASE("a read-only mount is refused (clients write there), and a mount point under a file is INVALID_ARGUMENT") {
  Scratch s;
  fs::create_directories(s.mnt);
  SUBCASE("read-only") {
    REQUIRE(Scratch::run(fmt::format("mount -o loop,ro '{}' '{}'", s.image.string(), s.mnt.string())));
    const std::string text = Scratch::refusal(s.request());
    INFO(text);
    CHECK(text.find("controllers[0].namespaces[0].mount: '" + s.mnt.string() + "' is mounted read-only from") !=
          std::string::npos);
    CHECK(::umount2(s.mnt.c_str(), 0) == 0);
  }
  SUBCASE("under a regular file") {
    MountRequest r = s.request();
    r.mount_point = (s.image / "mnt").string();
    const std::string text = Scratch::refusal(r);
    CHECK(text.find("lies under a file that is not a folder") != std::string::npos);
  }
}

TEST_CASE("tuttid holds an flock on a soft controller's image: an image locked by another process is refused") {
  using namespace tutti::daemon::testing;
  TestDaemon d;
  d.stop(SIGTERM);
  const fs::path image = d.dir() / "soft0.img";
  const int held = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);  // as a second tuttid serving the image would hold it
  d.start();
  const json devices = d.call({{"tutti", 1}, {"op", "devices"}});
  INFO(devices.dump());
  CHECK(devices["devices"][0]["state"] == "failed");
  const std::string why = devices["devices"][0]["error"];
  CHECK(why.find("controller soft0: soft.image: '" + image.string() + "' is locked (flock) by another process") !=
        std::string::npos);
  d.stop(SIGTERM);
  ::close(held);
  d.start();  // the lock released: it comes up
  CHECK(d.call({{"tutti", 1}, {"op", "devices"}})["devices"][0]["state"] == "up");
}

TEST_CASE("release unmounts only the mount it made: another one mounted on top is left, and said so") {
  Scratch s;
  auto m = NamespaceMount::mount_or_verify(s.request());
  REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
  REQUIRE(::mount("tmpfs", s.mnt.c_str(), "tmpfs", 0, nullptr) == 0);  // the admin's, on top of tuttid's
  const tutti::Status released = m->release();
  INFO(released.to_string());
  CHECK(released.code() == StatusCode::DEVICE_ERROR);
  CHECK(released.message().find("controllers[0].namespaces[0].mount: '" + s.mnt.string() +
                                "' now has tmpfs from tmpfs on top") != std::string::npos);
  CHECK(released.message().find("not the mount tuttid made") != std::string::npos);
  struct stat top {};
  REQUIRE(::stat(s.mnt.c_str(), &top) == 0);
  CHECK(top.st_dev != m->device());  // the tmpfs is still there
  CHECK(::umount2(s.mnt.c_str(), 0) == 0);
  CHECK(::umount2(s.mnt.c_str(), 0) == 0);  // and tuttid's beneath it, by hand
  CHECK(s.loops_gone());
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
