// The KV store across real processes (fork + exec of kv_helper, path in $TUTTI_KV_HELPER): a writer
// killed with SIGKILL in the middle of its stores leaves only complete blocks visible, every one
// verifying; one writer and two reader processes share a directory while a second writer is refused.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <require_ok.hpp>

#include <real_files.hpp>

#include "kv_test_support.hpp"

using namespace tutti;
using tutti::testing::require_ok;
using namespace tutti::kvtest;
using Store = kv::KvStore<UringRuntime>;

namespace {

/// A child process running kv_helper with `args`; its stdout is a pipe read line by line, its
/// stdin a pipe the test closes to let a writer finish.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    const char* helper = std::getenv("TUTTI_KV_HELPER");
    REQUIRE_MESSAGE(helper != nullptr, "TUTTI_KV_HELPER (the kv_helper binary) is not set; run through meson test");
    int out[2], in[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(in[0], 0);
      std::vector<char*> argv{const_cast<char*>(helper)};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(helper, argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(in[0]);
    stdout_ = ::fdopen(out[0], "r");
    stdin_ = in[1];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_) std::fclose(stdout_);
    if (stdin_ >= 0) ::close(stdin_);
  }
  /// The next line of output ("" at end of output).
  std::string line() {
    char buffer[512];
    if (std::fgets(buffer, sizeof buffer, stdout_) == nullptr) return "";
    std::string s(buffer);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void close_stdin() {
    ::close(stdin_);
    stdin_ = -1;
  }
  void kill9() { ::kill(pid_, SIGKILL); }
  /// The exit status (or 128 + signal), waiting at most `seconds`.
  int wait(int seconds = 120) {
    for (int i = 0; i < seconds * 100; ++i) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  int stdin_ = -1;
  bool reaped_ = false;
};

}  // namespace

TEST_CASE(
    "kill -9 of a writer in the middle of its stores: after reopening only complete blocks are visible, and all "
    "verify") {
  testing::TempDirectory dir;
  const std::string store_dir = dir.file("kv");
  std::uint64_t reported = 0;
  {
    Child child({"crash-writer", store_dir});
    // Let it commit a number of batches (past the 64 slots, so evictions happen too), then kill it
    // at a moment that falls inside a store most of the time (stores take most of its time).
    for (int i = 0; i < 30; ++i) {
      const std::string line = child.line();
      REQUIRE_MESSAGE(line.rfind("committed ", 0) == 0, "helper said: '", line, "'");
      reported = std::stoull(line.substr(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7));
    child.kill9();
    CHECK(child.wait() == 128 + SIGKILL);
  }
  UringRuntime rt = require_ok(make_uring_runtime());
  kv::StoreOptions o;
  auto opened = Store::open(rt, store_dir, small_namespace(4, 8192), o);  // the lock died with the child
  REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
  Store& store = **opened;
  CHECK(store.statistics().dropped_records == 0);
  Buffer buffer(2 * 8192);
  auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
  REQUIRE(memory.is_ok());
  std::size_t visible = 0;
  for (std::uint64_t i = 0; i < reported + 64; ++i) {
    std::vector<std::string> key{key_of(i)};
    if (store.lookup(views(key)).value() == 0) continue;
    ++visible;
    for (std::uint32_t layer = 0; layer < 4; ++layer) {
      std::memset(buffer.data, 0xA5, buffer.size);
      auto io = store.load(views(key), layer, pieces(*memory, 1, 2, 8192, 8192));
      REQUIRE(io.is_ok());
      auto r = store.wait(*io, 60 * kSecond);
      REQUIRE(r.is_ok());
      REQUIRE_MESSAGE(r->status.is_ok(), "block ", i, " layer ", layer, ": ", r->status.to_string());
      REQUIRE(holds(buffer.data, 8192, i, layer, 0));
      REQUIRE(holds(buffer.data + 8192, 8192, i, layer, 1));
    }
  }
  MESSAGE(reported, " blocks reported committed before SIGKILL; ", visible, " visible after reopen");
  CHECK(visible == store.statistics().visible_blocks);
  CHECK(visible >= 4);
  CHECK(visible <= 64);
  // The last batch the child reported is visible: nothing after it could evict it but a commit of
  // the next batch, and that commit's blocks would be visible instead.
  std::vector<std::string> last{key_of(reported - 1)};
  std::vector<std::string> next{key_of(reported + 3)};
  CHECK(store.lookup(views(last)).value() + store.lookup(views(next)).value() >= 1);
}

TEST_CASE(
    "a writer and two reader processes share one directory; a second writer process is refused naming the writer's "
    "pid") {
  testing::TempDirectory dir;
  const std::string store_dir = dir.file("kv");
  Child writer({"writer", store_dir, "4000"});  // 4000 blocks into 64 slots: readers race evictions
  REQUIRE(writer.line() == "committed 4");      // the store exists: readers may open it
  Child reader1({"reader", store_dir, "3"});
  Child reader2({"reader", store_dir, "3"});
  Child second({"second-writer", store_dir});
  const std::string refusal = second.line();
  CHECK(second.wait() == 0);
  CHECK_MESSAGE(refusal.find(fmt::format("process {} holds", writer.pid())) != std::string::npos, refusal);
  std::string line;
  do {
    line = writer.line();
  } while (!line.empty() && line != "done");
  CHECK(line == "done");
  const std::string r1 = reader1.line(), r2 = reader2.line();
  MESSAGE(r1);
  MESSAGE(r2);
  CHECK(reader1.wait() == 0);
  CHECK(reader2.wait() == 0);
  CHECK(r1.find("wrong 0") != std::string::npos);
  CHECK(r2.find("wrong 0") != std::string::npos);
  writer.close_stdin();
  CHECK(writer.wait() == 0);
}
