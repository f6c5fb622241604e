// Runs a real tuttid (the built binary, TUTTID in the environment) on a soft controller backed by a fresh
// image file in a temporary folder, and client processes forked from the test. Every wait is bounded.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include <tutti/core/clock.hpp>

#include "client.hpp"
#include "protocol.hpp"

namespace tutti::daemon::testing {

using json = nlohmann::json;
inline constexpr std::uint64_t kCallTimeoutNs = 10'000'000'000ull;

inline std::string current_user() {
  const passwd* pw = ::getpwuid(::getuid());
  REQUIRE(pw != nullptr);
  return pw->pw_name;
}

inline std::string env_or_fail(const char* name) {
  const char* value = std::getenv(name);
  REQUIRE_MESSAGE(value != nullptr, "set " << name);
  return value;
}

/// Waits for `pid` up to timeout_ns; SIGKILLs it when it has not exited by then. Returns the wait status.
inline int wait_bounded(pid_t pid, std::uint64_t timeout_ns) {
  const std::uint64_t deadline = deadline_after_ns(timeout_ns);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (remaining_ns(deadline) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

class TestDaemon {
 public:
  /// `controller_keys`: extra keys of the soft controller's object; `socket_keys`: extra keys of "socket".
  /// `grace_ms`: shutdown_grace_ms.
  /// `open_files_limit`: RLIMIT_NOFILE of the daemon (0: inherited).
  /// `ext4_image_bytes`: 0: the image is 16 MiB of zeros; else an ext4 file system of that size (mkfs.ext4),
  /// for a namespace tuttid mounts (root tests). `extra_controllers`: more objects of "controllers", after soft0.
  explicit TestDaemon(std::string controller_keys = "", std::string socket_keys = "", int grace_ms = 400,
                      rlim_t open_files_limit = 0, std::uint64_t ext4_image_bytes = 0,
                      std::string extra_controllers = "")
      : open_files_limit_(open_files_limit) {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("tuttid-test-{}-{}", ::getpid(), counter()++);
    std::filesystem::create_directories(dir_);
    ::chmod(dir_.c_str(), 0755);
    { std::ofstream image(dir_ / "soft0.img"); }
    std::filesystem::resize_file(dir_ / "soft0.img", ext4_image_bytes != 0 ? ext4_image_bytes : 16 << 20);
    if (ext4_image_bytes != 0)
      REQUIRE(std::system(
                  fmt::format("mkfs.ext4 -q -F -b 4096 '{}' >/dev/null 2>&1", (dir_ / "soft0.img").string()).c_str()) ==
              0);
    config_text_ = fmt::format(
        R"({{ "socket": {{"path": "{}" {}}}, "state_file": "{}", "shutdown_grace_ms": {},
              "controllers": [{{"name": "soft0", "soft": {{"image": "{}"}}, "io_queue_pairs": 10,
                                "kernel_queues": 2, "queue_depth": 32, {}
                                "client": {{"max_queues": 4, "default_pinned_bytes": 4096, "max_pinned_bytes": 67108864}} {} }} {}] }})",
        socket_path(), socket_keys.empty() ? "" : "," + socket_keys, (dir_ / "tuttid.state").string(), grace_ms,
        (dir_ / "soft0.img").string(),
        controller_keys.find("\"allow\"") == std::string::npos
            ? fmt::format(R"("allow": {{"users": ["{}"]}},)", current_user())
            : std::string(),
        controller_keys.empty() ? "" : "," + controller_keys, extra_controllers.empty() ? "" : "," + extra_controllers);
    std::ofstream(dir_ / "tuttid.json") << config_text_;
    start();
  }
  ~TestDaemon() {
    stop(SIGTERM);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void start() {
    const std::string binary = env_or_fail("TUTTID");
    const std::string config = (dir_ / "tuttid.json").string();
    const std::string log = (dir_ / "tuttid.log").string();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 2);
      if (open_files_limit_ != 0) {
        const rlimit limit{open_files_limit_, open_files_limit_};
        if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
      }
      ::execl(binary.c_str(), binary.c_str(), "--config", config.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const std::uint64_t deadline = deadline_after_ns(20'000'000'000ull);
    for (;;) {
      // tuttid listens before it brings up its controllers (a second tuttid must stop before touching them),
      // and answers only once bring-up (mounts included) is over: ready is a status answered, not a connect.
      if (auto c = Connection::connect(socket_path()); c.is_ok()) {
        const std::uint64_t left = remaining_ns(deadline);
        if (left > 0 && c.value().call({{"tutti", 1}, {"op", "status"}}, left).is_ok()) return;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("tuttid exited before listening: " << log_text());
      }
      REQUIRE_MESSAGE(remaining_ns(deadline) > 0, "tuttid did not listen within 20 s: " << log_text());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  /// Sends `signal` and waits (bounded); returns the wait status (-1: it had to be killed).
  int stop(int signal) {
    if (pid_ <= 0) return 0;
    ::kill(pid_, signal);
    const int status = wait_bounded(pid_, 20'000'000'000ull);
    pid_ = -1;
    return status;
  }
  pid_t pid() const { return pid_; }
  std::string socket_path() const { return (dir_ / "tuttid.sock").string(); }
  const std::filesystem::path& dir() const { return dir_; }
  std::string log_text() const {
    std::ifstream in(dir_ / "tuttid.log");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  Connection connect() const {
    auto c = Connection::connect(socket_path());
    REQUIRE_MESSAGE(c.is_ok(), c.status().to_string());
    return std::move(c.value());
  }
  json call(const json& request) const {
    auto c = connect();
    auto r = c.call(request, kCallTimeoutNs);
    REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
    return *r;
  }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path dir_;
  std::string config_text_;
  pid_t pid_ = -1;
  rlim_t open_files_limit_ = 0;
};

inline json acquire_request(std::uint32_t queues, std::uint64_t pinned_bytes = 4096) {
  return json{
      {"tutti", 1}, {"op", "acquire"}, {"controller", "soft0"}, {"queues", queues}, {"pinned_bytes", pinned_bytes}};
}

/// A client process: forked, runs `body(connection)` whose JSON result it writes to a pipe, then stays alive
/// (holding its leases) until the test kills it or closes `hold`. Returns the pid; result() reads the JSON.
class ClientProcess {
 public:
  ClientProcess(const std::string& socket_path, std::function<json(Connection&)> body,
                std::function<void()> before_connect = {}) {
    int result[2], hold[2];
    REQUIRE(::pipe2(result, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(hold, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(result[0]);
      ::close(hold[1]);
      if (before_connect) before_connect();
      json out;
      auto c = Connection::connect(socket_path);
      if (!c)
        out = json{{"connect_error", c.status().to_string()}};
      else
        out = body(c.value());
      const std::string text = out.dump() + "\n";
      (void)!::write(result[1], text.data(), text.size());
      char byte;
      (void)!::read(hold[0], &byte, 1);  // until the test closes hold or kills us
      ::_exit(0);
    }
    ::close(result[1]);
    ::close(hold[0]);
    result_fd_ = result[0];
    hold_fd_ = hold[1];
  }
  ~ClientProcess() {
    if (hold_fd_ >= 0) ::close(hold_fd_);
    if (result_fd_ >= 0) ::close(result_fd_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_bounded(pid_, 10'000'000'000ull);
    }
  }
  json result() {
    std::string text;
    char c;
    while (::read(result_fd_, &c, 1) == 1 && c != '\n') text += c;
    REQUIRE_MESSAGE(!text.empty(), "the client process wrote no result");
    return json::parse(text);
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
    wait_bounded(pid_, 10'000'000'000ull);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int result_fd_ = -1, hold_fd_ = -1;
};

}  // namespace tutti::daemon::testing
