// striped_nvme over N soft controllers, each backed by its own plain file (no root): shard
// targets with hand-built extents (chunks stored in reverse order, so a wrong placement or a
// wrong extent reads wrong bytes), reads and writes compared byte for byte with the backing
// files, unit sizes from 4 KiB to 2 MiB, requests that start and end mid-unit, one launch per
// submit for all controllers, 8 controllers in null mode, and one controller failing (injected
// error status with DNR set, lost completions) while the others' requests complete.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/path/striped_nvme.hpp>

#include "host_buffer.hpp"
#include "path_rig.hpp"
#include "soft_drive.hpp"
#include "test_files.hpp"

using namespace tutti;
using Path = striped_nvme::StripedNvmeDataPath;
using tutti::testing::Buffer;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;
constexpr std::uint64_t kChunk = 64 << 10;  // extent size of the hand-built shard files

/// N soft controllers on pattern-filled backing files (or null mode), their drivers, and a Path.
struct Rig : tutti::testing::PathRig<Path> {
  Rig(std::uint32_t n, std::uint64_t shard_bytes, Path::Options options = {}, bool null_mode = false)
      : PathRig(30 * kSecond), shard_bytes(shard_bytes) {
    std::vector<nvme::Controller*> raw;
    for (std::uint32_t d = 0; d < n; ++d) {
      libnvm::SoftControllerConfig config;
      config.null_mode = null_mode;
      // CUDA profile: GPU threads write the SQEs and ring the doorbells (suite gpu).
      config.accelerator_mode = accel::kProfile == accel::Profile::cuda;
      if (null_mode) config.namespace_size_lbas = (shard_bytes + (2 << 20)) / 4096;
      drives.push_back(
          std::make_unique<tutti::testing::SoftDrive>(config, shard_bytes + (2 << 20), 100 + d, "/tmp/tutti-striped-"));
      raw.push_back(drives.back()->controller.get());
    }
    auto p = Path::create(raw, options);
    REQUIRE_MESSAGE(p.is_ok(), p.status().to_string());
    path.emplace(std::move(p.value()));
  }
  ~Rig() { path.reset(); }  // before the controllers
  /// Shard d's extents: the file's kChunk chunks stored in reverse order from device byte
  /// 1 MiB + d * 64 KiB on (a different layout per shard).
  std::vector<local_file::Extent> extents(std::uint32_t d) const {
    std::vector<local_file::Extent> out;
    const std::uint64_t count = shard_bytes / kChunk, base = (1 << 20) + d * kChunk;
    for (std::uint64_t j = 0; j < count; ++j) out.push_back({j * kChunk, base + (count - 1 - j) * kChunk, kChunk});
    return out;
  }
  Path::open_target open(std::uint64_t unit) {
    striped_file::Target t;
    t.name = "synthetic";
    t.unit_bytes = unit;
    for (std::uint32_t d = 0; d < drives.size(); ++d) {
      local_file::Target s;
      s.path = "shard" + std::to_string(d);
      s.extents = extents(d);
      s.file_size = shard_bytes;
      s.lba_size = 4096;
      t.shards.push_back(std::move(s));
    }
    t.logical_size = (shard_bytes / unit) * unit * drives.size();
    return open_or_fail(std::move(t));
  }
  /// The device byte of logical byte x (placement, then shard d's extents).
  std::pair<std::uint32_t, std::uint64_t> device_byte(std::uint64_t x, std::uint64_t unit) const {
    const auto n = static_cast<std::uint32_t>(drives.size());
    const std::uint64_t u = x / unit, shard_offset = (u / n) * unit + x % unit;
    const std::uint64_t count = shard_bytes / kChunk, j = shard_offset / kChunk;
    const std::uint32_t d = static_cast<std::uint32_t>(u % n);
    return {d, (1 << 20) + d * kChunk + (count - 1 - j) * kChunk + shard_offset % kChunk};
  }
  /// What logical bytes [x, x + length) are on the backing files now (read 4 KiB at a time:
  /// placement and extents are 4 KiB-granular).
  std::vector<std::uint8_t> expected(std::uint64_t x, std::uint64_t length, std::uint64_t unit) const {
    std::vector<std::uint8_t> out;
    for (std::uint64_t at = x; at < x + length;) {
      const std::uint64_t step = std::min<std::uint64_t>(x + length, (at / 4096 + 1) * 4096) - at;
      const auto [d, device_offset] = device_byte(at, unit);
      auto part = tutti::testing::read_file(drives[d]->backing, device_offset, step);
      out.insert(out.end(), part.begin(), part.end());
      at += step;
    }
    return out;
  }

  std::uint64_t shard_bytes;
  std::vector<std::unique_ptr<tutti::testing::SoftDrive>> drives;
};

}  // namespace

TEST_CASE("placement is round robin by unit and the logical size is whole units of the shortest shard") {
  CHECK(striped_file::place(0, 4096, 3).shard == 0);
  CHECK(striped_file::place(4096, 4096, 3).shard == 1);
  CHECK(striped_file::place(3 * 4096 + 17, 4096, 3).shard == 0);
  CHECK(striped_file::place(3 * 4096 + 17, 4096, 3).shard_offset == 4096 + 17);
  CHECK(striped_file::place(7 * 8192 + 5, 8192, 2).shard == 1);
  CHECK(striped_file::place(7 * 8192 + 5, 8192, 2).shard_offset == 3 * 8192 + 5);
  striped_file::Target t;
  t.name = "x";
  t.unit_bytes = 8192;
  t.logical_size = 3 * 8192;  // not whole stripes of 2 x 8192
  t.shards.resize(2);
  CHECK(t.validate().code() == StatusCode::INVALID_ARGUMENT);
}

TEST_CASE(
    "reads and writes over 1, 2, 3 and 4 controllers are byte-exact for units from 4 KiB to 2 MiB, mid-unit "
    "starts and ends included, with one launch per submit") {
  const std::uint64_t shard_bytes = 8 << 20;
  for (std::uint32_t n : {1u, 2u, 3u, 4u}) {
    Rig rig(n, shard_bytes);
    Buffer buffer(std::max<std::uint64_t>(n * shard_bytes, 16 << 20));
    auto m = rig.map(buffer);
    for (std::uint64_t unit : {std::uint64_t{4096}, std::uint64_t{64} << 10, std::uint64_t{2} << 20}) {
      CAPTURE(n);
      CAPTURE(unit);
      auto t = rig.open(unit);
      const std::uint64_t size = rig.path->size_bytes(t);
      REQUIRE(size == n * shard_bytes);
      // The whole target, a request starting and ending mid-unit (when a unit holds more than one
      // 4 KiB block), and one inside a single unit.
      const std::uint64_t mid = unit > 4096 ? 4096 : 0;
      const std::uint64_t a_off = unit + mid, a_len = 3 * unit - 2 * mid;
      const std::uint64_t b_off = 2 * unit + mid, b_len = unit > 4096 ? unit - 2 * mid : 4096;
      std::memset(buffer.data, 0xEE, buffer.size);
      // Half the target per request, in requests of at most 64 pieces (credits: 2 queue pairs of
      // depth 256 per controller).
      const std::uint64_t step = std::min<std::uint64_t>(size / 2, 32 * unit);
      for (std::uint64_t first = 0; first < size; first += 8 * step) {  // 8 requests per batch
        std::vector<PathRequest<Path>> halves;
        for (std::uint64_t at = first; at < std::min(size, first + 8 * step); at += step)
          halves.push_back(Rig::request(Direction::READ, m, buffer, at, t, at, std::min(step, size - at)));
        std::vector<Status> states(halves.size());
        const std::uint64_t launches = rig.path->launches();
        auto batch = rig.path->submit(halves, states);
        CHECK(rig.path->launches() - launches == 1);  // one submit launch for every controller
        std::vector<RequestCompletion> done(halves.size());
        REQUIRE(rig.path->progress(batch, done, 30 * kSecond).is_ok());
        for (std::size_t i = 0; i < halves.size(); ++i) {
          REQUIRE_MESSAGE(states[i].is_ok(), states[i].to_string());
          REQUIRE_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
          CHECK(done[i].confirmed_bytes == halves[i].length);
        }
      }
      CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + size) == rig.expected(0, size, unit));
      std::memset(buffer.data, 0xEE, buffer.size);
      auto [s2, d2] = rig.run({Rig::request(Direction::READ, m, buffer, 0, t, a_off, a_len),
                               Rig::request(Direction::READ, m, buffer, 8 << 20, t, b_off, b_len)});
      REQUIRE(d2[0].status.is_ok());
      REQUIRE(d2[1].status.is_ok());
      CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + a_len) == rig.expected(a_off, a_len, unit));
      CHECK(std::vector<std::uint8_t>(buffer.bytes() + (8 << 20), buffer.bytes() + (8 << 20) + b_len) ==
            rig.expected(b_off, b_len, unit));
      CHECK(buffer.bytes()[a_len] == 0xEE);  // nothing past the request
      // A write starting and ending mid-unit lands on the right shards, and reads back.
      const auto pattern = tutti::testing::pattern(unit + n, 0, a_len);
      std::memcpy(buffer.data, pattern.data(), a_len);
      auto [s3, d3] = rig.run({Rig::request(Direction::WRITE, m, buffer, 0, t, a_off, a_len)});
      REQUIRE_MESSAGE(d3[0].status.is_ok(), d3[0].status.to_string());
      CHECK(d3[0].confirmed_bytes == a_len);
      CHECK(rig.expected(a_off, a_len, unit) == pattern);
      std::memset(buffer.data, 0xEE, buffer.size);
      auto [s4, d4] = rig.run({Rig::request(Direction::READ, m, buffer, 4096, t, a_off, a_len)});
      REQUIRE(d4[0].status.is_ok());
      CHECK(std::vector<std::uint8_t>(buffer.bytes() + 4096, buffer.bytes() + 4096 + a_len) == pattern);
      CHECK(rig.path->close(t).is_ok());
    }
    CHECK(rig.path->unregister_memory(m).is_ok());
  }
}

TEST_CASE("a submit kernel that polls (submit_poll_budget_ns) completes every piece: one launch per batch in all") {
  Path::Options o;
  o.submit_poll_budget_ns = Path::Options::kMaxPollKernelBudgetNs;
  Rig rig(3, 4 << 20, o);
  Buffer buffer(8 << 20);
  auto m = rig.map(buffer);
  auto t = rig.open(64 << 10);
  std::memset(buffer.data, 0xEE, buffer.size);
  // Requests that start and end mid-unit, each split over all three controllers.
  std::vector<PathRequest<Path>> requests;
  for (std::uint64_t i = 0; i < 4; ++i)
    requests.push_back(Rig::request(Direction::READ, m, buffer, i * (1 << 20), t, i * 300 * 4096 + 4096, 200 * 4096));
  std::vector<Status> states(requests.size());
  const std::uint64_t launches = rig.path->launches();
  auto batch = rig.path->submit(requests, states);
  for (const Status& s : states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  std::vector<RequestCompletion> done(requests.size());
  REQUIRE(rig.path->progress(batch, done, 30 * kSecond).is_ok());
  CHECK(rig.path->launches() - launches == 1);  // the submit's; progress launched nothing
  for (std::uint64_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    REQUIRE_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
    CHECK(done[i].confirmed_bytes == 200 * 4096);
    CHECK(std::vector<std::uint8_t>(buffer.bytes() + i * (1 << 20), buffer.bytes() + i * (1 << 20) + 200 * 4096) ==
          rig.expected(i * 300 * 4096 + 4096, 200 * 4096, 64 << 10));
  }
  batch = {};
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("pieces refused for queue credits are admitted by progress, and the request completes byte-exact") {
  Path::Options o;
  o.queue_pairs = 1;
  o.queue_depth = 16;  // 15 credits per controller
  // A polling submit: on the GPU the admitted pieces may all be done when submit returns while others
  // wait for credits, so only the deferred pieces make progress launch (reports_settled alone would
  // skip it, and the request would time out). In the host profile a block's threads run one after
  // another and each admission waits for the polling before it, so credits come back in time and
  // every piece is admitted by submit.
  bool polls = false;
  SUBCASE("submit does not poll") {}
  SUBCASE("submit polls") {
    o.submit_poll_budget_ns = Path::Options::kMaxPollKernelBudgetNs;
    polls = true;
  }
  Rig rig(2, 1 << 20, o);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  auto t = rig.open(4096);
  std::vector<Status> states(1);
  std::vector<PathRequest<Path>> rs{Rig::request(Direction::READ, m, buffer, 0, t, 0, 1 << 20)};  // 128 per controller
  const std::uint64_t launches = rig.path->launches();
  auto batch = rig.path->submit(rs, states);
  REQUIRE_MESSAGE(states[0].is_ok(), states[0].to_string());
  std::vector<RequestCompletion> done(1);
  REQUIRE(rig.path->progress(batch, done, 30 * kSecond).is_ok());
  REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
  CHECK(done[0].confirmed_bytes == 1 << 20);
  CHECK(done[0].commands == 256);
  if (!polls || accel::kProfile == accel::Profile::cuda)
    CHECK(rig.path->launches() - launches > 2);  // admissions of the deferred pieces
  else
    CHECK(rig.path->launches() - launches == 1);  // every piece admitted and done inside submit's kernel
  CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + (1 << 20)) == rig.expected(0, 1 << 20, 4096));
  CHECK(rig.path->close(t).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("a batch whose every piece of a request is refused for credits refuses that request, nothing runs") {
  Path::Options o;
  o.queue_pairs = 1;
  o.queue_depth = 16;
  Rig rig(2, 1 << 20, o);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  auto t = rig.open(4096);
  std::vector<PathRequest<Path>> rs;
  for (std::uint64_t at = 0; at < (512 << 10); at += 8192)
    rs.push_back(Rig::request(Direction::READ, m, buffer, at, t, at, 8192));
  std::vector<Status> states(rs.size());
  auto batch = rig.path->submit(rs, states);
  std::size_t accepted = 0, refused = 0;
  for (const Status& s : states) {
    if (s.is_ok()) {
      ++accepted;
    } else {
      CHECK(s.code() == StatusCode::RESOURCE_EXHAUSTED);
      ++refused;
    }
  }
  CHECK(accepted >= 1);
  CHECK(refused >= 1);
  std::vector<RequestCompletion> done(rs.size());
  REQUIRE(rig.path->progress(batch, done, 30 * kSecond).is_ok());
  for (std::size_t i = 0; i < rs.size(); ++i)
    if (states[i].is_ok()) CHECK_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
  CHECK(rig.path->close(t).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("several striped targets in one batch, and a flush reaches every controller") {
  Rig rig(3, 2 << 20);
  Buffer buffer(8 << 20);
  auto m = rig.map(buffer);
  auto small = rig.open(16 << 10);
  auto large = rig.open(256 << 10);
  auto [states, done] = rig.run({Rig::request(Direction::READ, m, buffer, 0, small, 16 << 10, 200 << 10),
                                 Rig::request(Direction::READ, m, buffer, 1 << 20, large, 128 << 10, 1 << 20),
                                 PathRequest<Path>{Direction::FLUSH, nullptr, MemoryView{}, 0, &large, 0, 0}});
  for (std::size_t i = 0; i < 3; ++i) REQUIRE_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
  CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + (200 << 10)) ==
        rig.expected(16 << 10, 200 << 10, 16 << 10));
  CHECK(std::vector<std::uint8_t>(buffer.bytes() + (1 << 20), buffer.bytes() + (2 << 20)) ==
        rig.expected(128 << 10, 1 << 20, 256 << 10));
  CHECK(done[2].commands == 3);
  for (const auto& d : rig.drives) CHECK(d->device->counters().flush_commands == 1);
  CHECK(rig.path->close(small).is_ok());
  CHECK(rig.path->close(large).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("eight controllers in null mode: every unit piece reaches its controller, round robin") {
  Rig rig(8, 1 << 20, {}, true);
  Buffer buffer(8 << 20);
  auto m = rig.map(buffer);
  auto t = rig.open(16 << 10);
  // 8 MiB = 512 units of 16 KiB: 64 per controller; one 4 KiB-offset request adds a piece on 0 and 1.
  auto [states, done] = rig.run({Rig::request(Direction::READ, m, buffer, 0, t, 0, 8 << 20),
                                 Rig::request(Direction::READ, m, buffer, 0, t, 12 << 10, 8 << 10)});
  REQUIRE(done[0].status.is_ok());
  REQUIRE(done[1].status.is_ok());
  CHECK(done[0].confirmed_bytes == 8 << 20);
  CHECK(done[0].commands == 512);
  for (std::uint32_t d = 0; d < 8; ++d) CHECK(rig.drives[d]->device->counters().read_commands == (d < 2 ? 65u : 64u));
  CHECK(rig.path->close(t).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("one controller failing with an error status (DNR set) fails exactly the requests that touch it") {
  Rig rig(4, 1 << 20);
  Buffer buffer(4 << 20);
  auto m = rig.map(buffer);
  auto t = rig.open(64 << 10);
  libnvm::SoftFaultRule rule;  // Unrecovered Read Error, DNR 1: no retry may hide it
  rule.max_fires = 0;
  rig.drives[2]->device->inject_fault(rule);
  // Units 0..3 are on controllers 0..3: a request over units 0-1, one over 2, one over 3-5.
  const auto start = accel::timer_ns();
  auto [states, done] = rig.run({Rig::request(Direction::READ, m, buffer, 0, t, 0, 128 << 10),
                                 Rig::request(Direction::READ, m, buffer, 1 << 20, t, 128 << 10, 64 << 10),
                                 Rig::request(Direction::READ, m, buffer, 2 << 20, t, 192 << 10, 192 << 10)});
  // An error status is final at once: no retry (DNR) and no wait for a timeout (5 s by default).
  CHECK(accel::timer_ns() - start < 4'000'000'000u);
  CHECK(done[1].retries == 0);
  CHECK(done[0].status.is_ok());
  CHECK(done[0].confirmed_bytes == 128 << 10);
  CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + (128 << 10)) ==
        rig.expected(0, 128 << 10, 64 << 10));
  CHECK(done[1].status.code() == StatusCode::DEVICE_ERROR);
  CHECK(done[1].device_status == 0x281);
  CHECK(done[1].confirmed_bytes == 0);
  CHECK(done[1].status.message().find("controller 2") != std::string::npos);
  CHECK(done[2].status.is_ok());
  CHECK(done[2].confirmed_bytes == 192 << 10);
  CHECK(std::vector<std::uint8_t>(buffer.bytes() + (2 << 20), buffer.bytes() + (2 << 20) + (192 << 10)) ==
        rig.expected(192 << 10, 192 << 10, 64 << 10));
  CHECK(rig.drives[2]->device->counters().injected_faults == 1);
  CHECK(rig.path->close(t).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("one controller losing its completions times out only the requests that touch it, within the budget") {
  Path::Options o;
  o.command_timeout_ns = 50'000'000;  // 50 ms
  Rig rig(4, 1 << 20, o);
  Buffer buffer(4 << 20);
  auto m = rig.map(buffer);
  auto t = rig.open(64 << 10);
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::lose_completion;
  rule.max_fires = 0;
  rig.drives[1]->device->inject_fault(rule);
  const auto start = accel::timer_ns();
  // Units 0, 2, 3 and 4 avoid controller 1; the second request's second piece (unit 5) is on it.
  auto [states, done] = rig.run({Rig::request(Direction::READ, m, buffer, 0, t, 0, 64 << 10),
                                 Rig::request(Direction::READ, m, buffer, 1 << 20, t, 256 << 10, 128 << 10),
                                 Rig::request(Direction::READ, m, buffer, 2 << 20, t, 128 << 10, 128 << 10)});
  const auto elapsed = accel::timer_ns() - start;
  CHECK(done[0].status.is_ok());
  CHECK(done[2].status.is_ok());
  CHECK(std::vector<std::uint8_t>(buffer.bytes() + (2 << 20), buffer.bytes() + (2 << 20) + (128 << 10)) ==
        rig.expected(128 << 10, 128 << 10, 64 << 10));
  CHECK(done[1].status.code() == StatusCode::TIMEOUT);
  CHECK(done[1].confirmed_bytes == 64 << 10);  // its first piece (controller 0) moved; the second did not
  CHECK(rig.path->aborts_sent() >= 1);
  CHECK(elapsed >= 50'000'000u);
  CHECK(elapsed < 5 * kSecond);
  CHECK(rig.path->close(t).is_ok());
  (void)rig.path->unregister_memory(m);  // BUSY while the lost command's memory must stay mapped
}

TEST_CASE("create and open refuse what they cannot serve, naming the value and the limit") {
  auto none = Path::create(std::span<nvme::Controller* const>{}, {});
  REQUIRE_FALSE(none.is_ok());
  CHECK(none.status().code() == StatusCode::INVALID_ARGUMENT);
  CHECK(none.status().message().find("0 controllers; expected 1 to 64") != std::string::npos);
  nvme::Controller* const unused[1] = {nullptr};
  auto null_one = Path::create(std::span<nvme::Controller* const>(unused), {});
  REQUIRE_FALSE(null_one.is_ok());
  CHECK(null_one.status().message().find("controllers[0] is null") != std::string::npos);
  Rig rig(2, 1 << 20);
  nvme::Controller* const two[2] = {rig.drives[0]->controller.get(), rig.drives[1]->controller.get()};
  Path::Options too_many;
  too_many.max_batches_in_flight = 2;
  too_many.prepared_batches = 3;
  too_many.prepared_batch_requests = 8;
  auto refused_prepared = Path::create(std::span<nvme::Controller* const>(two), too_many);
  REQUIRE_FALSE(refused_prepared.is_ok());
  CHECK(refused_prepared.status().code() == StatusCode::INVALID_ARGUMENT);
  CHECK(refused_prepared.status().message().find("prepared_batches") != std::string::npos);
  striped_file::Target one;
  one.name = "one";
  one.unit_bytes = 4096;
  one.shards.resize(1);
  one.logical_size = 1 << 20;
  auto opened = rig.path->open(std::move(one), {});
  REQUIRE_FALSE(opened.is_ok());
  CHECK(opened.status().message().find("1 shards but the DataPath drives 2 controllers") != std::string::npos);
  striped_file::Target odd;  // a unit that is not a multiple of the 4096-byte LBA size
  odd.name = "odd";
  odd.unit_bytes = 6144;
  for (std::uint32_t d = 0; d < 2; ++d) {
    local_file::Target s;
    s.path = "shard";
    s.extents = rig.extents(d);
    s.file_size = 1 << 20;
    s.lba_size = 4096;
    odd.shards.push_back(std::move(s));
  }
  odd.logical_size = 2 * 6144;
  auto refused = rig.path->open(std::move(odd), {});
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().message().find("unit = 6144 bytes is not a multiple of shard 0") != std::string::npos);
}

TEST_CASE("prepared batch slots exist after create and serve submits of up to their pieces without a new slot") {
  Path::Options o;
  o.max_batches_in_flight = 4;
  o.prepared_batches = 2;
  o.prepared_batch_requests = 16;  // pieces: 8 requests of two 64 KiB units each
  Rig rig(2, 4 << 20, o);
  CHECK(rig.path->batch_slots_allocated() == 2);
  auto t = rig.open(64 << 10);
  Buffer buffer(4 << 20);
  auto m = rig.map(buffer);
  std::vector<std::vector<PathRequest<Path>>> requests(2);
  std::vector<std::vector<Status>> states(2, std::vector<Status>(8));
  std::vector<Path::batch> batches;
  for (std::size_t b = 0; b < 2; ++b) {
    for (std::uint64_t i = 0; i < 8; ++i) {
      const std::uint64_t at = (b * 8 + i) * (128 << 10);
      requests[b].push_back(rig.request(Direction::READ, m, buffer, at, t, at, 128 << 10));
    }
    batches.push_back(rig.path->submit(requests[b], states[b]));
    for (auto& s : states[b]) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  }
  CHECK(rig.path->batch_slots_allocated() == 2);  // two batches in flight, no slot made at submit
  for (auto& b : batches) {
    std::vector<RequestCompletion> c(8);
    REQUIRE(rig.path->progress(b, c, 10 * kSecond).is_ok());
    for (auto& one : c) CHECK(one.confirmed_bytes == 128 << 10);
  }
  batches.clear();
  const auto expected = rig.expected(0, 2 << 20, 64 << 10);
  CHECK(std::equal(expected.begin(), expected.end(), buffer.bytes()));
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("two threads submitting to the same striped target concurrently both read byte-exact") {
  Rig rig(3, 2 << 20);
  Buffer a(1 << 20), b(1 << 20);
  auto ma = rig.map(a);
  auto mb = rig.map(b);
  auto t = rig.open(16 << 10);
  const auto expected = rig.expected(0, 1 << 20, 16 << 10);
  const auto worker = [&](Buffer& buffer, Path::registered_memory& m, bool& ok) {
    ok = true;
    for (int round = 0; round < 10 && ok; ++round) {
      std::memset(buffer.data, 0xEE, buffer.size);
      std::vector<PathRequest<Path>> rs;
      for (std::uint64_t at = 0; at < (1 << 20); at += 256 << 10)
        rs.push_back(Rig::request(Direction::READ, m, buffer, at, t, at, 256 << 10));
      std::vector<Status> states(rs.size());
      auto batch = rig.path->submit(rs, states);
      std::vector<RequestCompletion> done(rs.size());
      ok = rig.path->progress(batch, done, 30 * kSecond).is_ok();
      for (std::size_t i = 0; i < rs.size() && ok; ++i) ok = states[i].is_ok() && done[i].status.is_ok();
      ok = ok && std::memcmp(buffer.data, expected.data(), expected.size()) == 0;
    }
  };
  bool ok_a = false, ok_b = false;
  std::thread first([&] { worker(a, ma, ok_a); });
  std::thread second([&] { worker(b, mb, ok_b); });
  first.join();
  second.join();
  CHECK(ok_a);
  CHECK(ok_b);
  CHECK(rig.path->close(t).is_ok());
  CHECK(rig.path->unregister_memory(ma).is_ok());
  CHECK(rig.path->unregister_memory(mb).is_ok());
}

TEST_CASE(
    "a request that alone splits into more unit pieces than a submit takes is refused for good, not as backpressure") {
  // 1 GiB from a mid-unit offset at 4 KiB units: 2^18 + 1 pieces, one more than a submit takes.
  // Reported RESOURCE_EXHAUSTED, a caller would resubmit it forever; it is INVALID_ARGUMENT, and the
  // small request beside it is backpressure (it runs when submitted without the large one).
  Rig rig(2, (1ull << 29) + (1 << 20), {}, true);
  Buffer buffer((1ull << 30) + (64 << 10));
  auto m = rig.map(buffer);
  auto t = rig.open(4096);
  std::vector<PathRequest<Path>> both{Rig::request(Direction::READ, m, buffer, 0, t, 2048, 1ull << 30),
                                      Rig::request(Direction::READ, m, buffer, 0, t, 0, 8192)};
  std::vector<Status> states(both.size());
  auto b = rig.path->submit(both, states);
  std::vector<RequestCompletion> completions(both.size());
  CHECK(rig.path->progress(b, completions, 10 * kSecond).is_ok());
  CHECK(states[0].code() == StatusCode::INVALID_ARGUMENT);
  CHECK(states[0].message().find("requests[0].length = 1073741824") != std::string::npos);
  CHECK(states[0].message().find("262145 unit pieces") != std::string::npos);
  CHECK(states[1].code() == StatusCode::RESOURCE_EXHAUSTED);
  auto [alone, done] = rig.run({both[1]});
  CHECK(alone[0].is_ok());
  CHECK(done[0].status.is_ok());
  CHECK(rig.path->close(t).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}
