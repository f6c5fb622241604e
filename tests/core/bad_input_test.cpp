// Bad input: each case returns the right code with a message naming the field and the limit, and
// nothing of a rejected request runs.
#include <doctest/doctest.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include <faulty_datapath.hpp>
#include <tutti/tutti.hpp>

using namespace tutti;
using tutti::testing::Faults;
using tutti::testing::FaultyBackend;
using tutti::testing::FaultyDataPath;

namespace {
constexpr std::uint64_t kSecond = 1'000'000'000;

struct Fixture {
  std::shared_ptr<Faults> faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt{FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}}};
  alignas(4096) std::byte memory[16384]{};
  TargetHandle target;
  TargetHandle readonly;
  MemoryHandle mem;
  Fixture() {
    target = *rt.open("memfs://bad-input?size=10000", {.writable = true});  // 10000: not a multiple of 512
    readonly = *rt.open("memfs://bad-input");
    mem = *rt.register_memory({memory, sizeof(memory), MemoryKind::HOST});
  }
  Status one(IoRequest r) {
    std::vector<IoRequest> batch{r};
    auto outcome = rt.submit(batch);
    if (outcome.accepted == 1) {
      auto done = rt.wait(outcome.io, kSecond);
      (void)rt.release(outcome.io);
      return done.is_ok() ? done->status : done.status();
    }
    CHECK(outcome.io.is_null());
    return outcome.initial_states[0];
  }
};

void expect(const Status& s, StatusCode code, std::string_view words) {
  CAPTURE(s.to_string());
  CHECK(s.code() == code);
  CHECK(s.message().find(words) != std::string::npos);
}
}  // namespace

TEST_CASE("zero-length READ and WRITE are INVALID_ARGUMENT naming length") {
  Fixture f;
  expect(f.one({Direction::READ, f.mem, 0, f.target, 0, 0}), StatusCode::INVALID_ARGUMENT, "length is 0");
  expect(f.one({Direction::WRITE, f.mem, 0, f.target, 0, 0}), StatusCode::INVALID_ARGUMENT, "length is 0");
}

TEST_CASE("null, stale and foreign handles are rejected") {
  Fixture f;
  expect(f.one({Direction::READ, {}, 0, f.target, 0, 512}), StatusCode::INVALID_ARGUMENT,
         "requests[0].memory is a null");
  expect(f.one({Direction::READ, f.mem, 0, {}, 0, 512}), StatusCode::INVALID_ARGUMENT, "requests[0].target is a null");

  auto closed = *f.rt.open("memfs://closed?size=4096");
  REQUIRE(f.rt.close(closed).is_ok());
  expect(f.one({Direction::READ, f.mem, 0, closed, 0, 512}), StatusCode::NOT_FOUND, "stale");
  CHECK(f.rt.close(closed).code() == StatusCode::NOT_FOUND);

  std::vector<std::byte> other(4096);
  auto gone = *f.rt.register_memory({other.data(), other.size(), MemoryKind::HOST});
  REQUIRE(f.rt.unregister_memory(gone).is_ok());
  expect(f.one({Direction::READ, gone, 0, f.target, 0, 512}), StatusCode::NOT_FOUND, "stale");

  MemfsRuntime second = testing::require_ok(make_memfs_runtime());
  auto foreign = *second.open("memfs://foreign?size=4096");
  expect(f.one({Direction::READ, f.mem, 0, Handle<TargetTag>(foreign), 0, 512}), StatusCode::INVALID_ARGUMENT,
         "another runtime");
  CHECK(f.rt.wait(IoHandle{}, 1).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(f.rt.query(IoHandle{}).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(f.rt.release(IoHandle{}).code() == StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("offsets past the end and offset + length overflow are OUT_OF_RANGE, checked without wrapping") {
  Fixture f;
  expect(f.one({Direction::READ, f.mem, 0, f.target, 10240, 512}), StatusCode::OUT_OF_RANGE, "target size of 10000");
  expect(f.one({Direction::READ, f.mem, 0, f.target, UINT64_MAX - 511, 1024}), StatusCode::OUT_OF_RANGE,
         "past the target");
  expect(f.one({Direction::READ, f.mem, 16384, f.target, 0, 512}), StatusCode::OUT_OF_RANGE, "registered region");
  expect(f.one({Direction::READ, f.mem, UINT64_MAX - 7, f.target, 0, 512}), StatusCode::OUT_OF_RANGE,
         "registered region");
}

TEST_CASE("misaligned offsets, lengths and addresses are INVALID_ARGUMENT naming the field and alignment") {
  Fixture f;
  expect(f.one({Direction::READ, f.mem, 0, f.target, 100, 512}), StatusCode::INVALID_ARGUMENT,
         "target_offset = 100 is not a multiple of 512");
  expect(f.one({Direction::READ, f.mem, 0, f.target, 0, 1000}), StatusCode::INVALID_ARGUMENT,
         "length = 1000 is not a multiple of 512");
  expect(f.one({Direction::READ, f.mem, 4, f.target, 0, 512}), StatusCode::INVALID_ARGUMENT, "multiple of 8 bytes");
  expect(f.one({Direction::READ, f.mem, 0, f.target, 0, (1 << 20) + 512}), StatusCode::INVALID_ARGUMENT,
         "exceeds the backend limit of 1048576 bytes");
}

TEST_CASE("the tail rule: an unaligned length may end at the end of the target when memory has room") {
  Fixture f;
  // 10000 = 19 * 512 + 272: a request for the last 272 bytes ends at the end of the target.
  CHECK(f.one({Direction::READ, f.mem, 0, f.target, 9728, 272}).is_ok());
  // Room is needed for the whole last unit: 512 bytes from memory_offset 16384 - 300 do not fit.
  expect(f.one({Direction::READ, f.mem, 16384 - 300, f.target, 9728, 272}), StatusCode::OUT_OF_RANGE, "aligned unit");
}

TEST_CASE("FLUSH takes only a target; WRITE needs a writable target; bad directions are rejected") {
  Fixture f;
  CHECK(f.one({Direction::FLUSH, {}, 0, f.target, 0, 0}).is_ok());
  expect(f.one({Direction::FLUSH, f.mem, 0, f.target, 0, 512}), StatusCode::INVALID_ARGUMENT, "FLUSH");
  expect(f.one({Direction::WRITE, f.mem, 0, f.readonly, 0, 512}), StatusCode::INVALID_ARGUMENT, "read-only");
  expect(f.one({static_cast<Direction>(9), f.mem, 0, f.target, 0, 512}), StatusCode::INVALID_ARGUMENT, "direction = 9");
}

TEST_CASE("a batch with invalid requests runs only the valid ones, and nothing of the invalid ones") {
  Fixture f;
  std::memset(f.memory, 0x77, sizeof(f.memory));
  std::vector<IoRequest> batch{{Direction::WRITE, f.mem, 0, f.target, 0, 512},
                               {Direction::WRITE, f.mem, 0, f.target, 600, 512},        // misaligned: rejected
                               {Direction::WRITE, f.mem, 0, f.target, 9728, 512 * 2}};  // past the end
  auto outcome = f.rt.submit(batch);
  CHECK(outcome.accepted == 1);
  CHECK(outcome.initial_states[1].code() == StatusCode::INVALID_ARGUMENT);
  CHECK(outcome.initial_states[2].code() == StatusCode::OUT_OF_RANGE);
  REQUIRE(f.rt.wait(outcome.io, kSecond).is_ok());
  std::vector<std::byte> back(10240);
  auto b = *f.rt.register_memory({back.data(), back.size(), MemoryKind::HOST});
  std::vector<IoRequest> read{{Direction::READ, b, 0, f.target, 0, 9728}};
  auto r = f.rt.submit(read);
  REQUIRE(f.rt.wait(r.io, kSecond).is_ok());
  CHECK(back[0] == std::byte{0x77});
  CHECK(back[600] == std::byte{0});  // rejected write did not land
  CHECK(back[9727] == std::byte{0});
}

TEST_CASE("bad memory registrations are INVALID_ARGUMENT or UNSUPPORTED") {
  MemfsRuntime rt = testing::require_ok(make_memfs_runtime());
  std::byte one[1];
  CHECK(rt.register_memory({nullptr, 16, MemoryKind::HOST}).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(rt.register_memory({one, 0, MemoryKind::HOST}).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(rt.register_memory({reinterpret_cast<void*>(UINTPTR_MAX - 8), 64, MemoryKind::HOST}).code() ==
        StatusCode::INVALID_ARGUMENT);
  CHECK(rt.register_memory({one, 1, MemoryKind::DEVICE, -1}).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(rt.register_memory({one, 1, static_cast<MemoryKind>(200)}).code() == StatusCode::INVALID_ARGUMENT);
  auto device = rt.register_memory({one, 1, MemoryKind::DEVICE, 0});
  CHECK(device.code() == StatusCode::UNSUPPORTED);
  CHECK(device.status().message().find("DEVICE") != std::string::npos);
}

TEST_CASE("unknown schemes and malformed URIs are INVALID_ARGUMENT naming the problem") {
  MemfsRuntime rt = testing::require_ok(make_memfs_runtime());
  struct Case {
    const char* uri;
    StatusCode code;
    const char* words;
  };
  for (const Case& c :
       {Case{"", StatusCode::INVALID_ARGUMENT, "empty"}, Case{"memfs-no-marker", StatusCode::INVALID_ARGUMENT, "'://'"},
        Case{"s3://bucket/key", StatusCode::INVALID_ARGUMENT, "no backend serves"},
        Case{"memfs://x?size=%zz", StatusCode::INVALID_ARGUMENT, "percent-encoding"},
        Case{"memfs://x?size=12abc", StatusCode::INVALID_ARGUMENT, "not a decimal number"},
        Case{"memfs://x?size=", StatusCode::INVALID_ARGUMENT, "not a decimal number"},
        Case{"memfs://x?size=0", StatusCode::INVALID_ARGUMENT, "outside 1.."},
        Case{"memfs://x?size=99999999999999999999", StatusCode::INVALID_ARGUMENT, "not a decimal"},
        Case{"memfs://x?color=red", StatusCode::INVALID_ARGUMENT, "unknown query key 'color'"},
        Case{"memfs://?size=1", StatusCode::INVALID_ARGUMENT, "name length 0"},
        Case{"memfs://a%20b?size=1", StatusCode::INVALID_ARGUMENT, "[A-Za-z0-9._-]"},
        Case{"memfs://x/y?size=1", StatusCode::INVALID_ARGUMENT, "no path"},
        Case{"memfs://a:99?size=10", StatusCode::INVALID_ARGUMENT, "no user info, port or fragment"},
        Case{"memfs://user@b?size=10", StatusCode::INVALID_ARGUMENT, "no user info, port or fragment"},
        Case{"memfs://c?size=10#frag", StatusCode::INVALID_ARGUMENT, "no user info, port or fragment"},
        Case{"memfs://c?size=10&size=20", StatusCode::INVALID_ARGUMENT, "more than once"},
        Case{"memfs://never-created", StatusCode::NOT_FOUND, "does not exist"}}) {
    CAPTURE(c.uri);
    auto opened = rt.open(c.uri);
    CHECK(opened.code() == c.code);
    CHECK(opened.status().message().find(c.words) != std::string::npos);
  }
  REQUIRE(rt.open("memfs://sized?size=4096").is_ok());
  CHECK(rt.open("memfs://sized?size=8192").code() == StatusCode::INVALID_ARGUMENT);
}
