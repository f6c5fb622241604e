// striped:// over real ext4 images (root): one soft controller per image, each image loop-mounted;
// shard files written through ext4, resolved by the striped_file resolver (FIEMAP per shard),
// read and written through every controller's NVMe queues with one launch per submit, and
// compared with what the file systems hold. Also every resolver error, shards on namespaces of
// different LBA formats, and one runtime mixing striped and plain local_nvme targets in a batch.
// GCC 12 with -fsanitize=address reports the deleter's shared_ptr of local_nvme::Batch as "may be used
// uninitialized" where StorageRuntime moves the optional batch of its second backend (a false
// positive: the optional is engaged there). Only this two-backend runtime instantiates that move.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include <doctest/doctest.h>

#include <scratch_filesystem.hpp>
#include <tutti/libnvm/soft_striped_nvme.hpp>

#include "host_buffer.hpp"
#include "path_rig.hpp"
#include "test_files.hpp"

using namespace tutti;
using tutti::testing::Buffer;
using tutti::testing::ScratchFilesystem;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;

/// N ext4 images (64 MiB each; loop devices of `sectors[i]`-byte sectors) and the soft stack over them.
struct Rig {
  explicit Rig(std::vector<std::uint32_t> sectors) {
    SoftStripedNvmeOptions o;
    for (std::uint32_t sector : sectors) {
      ScratchFilesystem::Options f;
      f.size_bytes = 64 << 20;
      f.sector_size = sector;
      auto fs = ScratchFilesystem::create(f);
      REQUIRE_MESSAGE(fs.is_ok(), fs.status().to_string());
      filesystems.push_back(std::move(fs.value()));
      SoftStripedDevice d;
      d.backing_path = filesystems.back()->image_path();
      d.block_device_path = filesystems.back()->loop_device();
      d.soft.lba_size = sector;
      d.soft.scatter_bus_pages = true;
      o.devices.push_back(d);
    }
    auto s = make_soft_striped_nvme(o);
    REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
    stack = std::move(s.value());
  }
  ~Rig() { stack.reset(); }
  StripedMixedRuntime& rt() { return *stack->runtime; }
  /// Writes shard files `name` (pattern seed 10 + i) of `bytes[i]` bytes, returns the devs value.
  std::string write_shards(const std::string& name, const std::vector<std::uint64_t>& bytes) {
    std::string devs;
    for (std::size_t i = 0; i < filesystems.size(); ++i) {
      const std::string path = filesystems[i]->path(name);
      tutti::testing::write_pattern_file(path, 10 + i, bytes[i]);
      devs += (i ? "," : "") + path;
    }
    return devs;
  }
  /// Logical bytes [x, x + n) of striped target `name` as the shard files hold them (O_DIRECT).
  std::vector<std::uint8_t> expected(const std::string& name, std::uint64_t unit, std::uint64_t x, std::uint64_t n) {
    std::vector<std::uint8_t> out;
    const auto count = static_cast<std::uint32_t>(filesystems.size());
    for (std::uint64_t at = x; at < x + n;) {
      const std::uint64_t step = std::min(x + n, (at / unit + 1) * unit) - at;
      const striped_file::Placement p = striped_file::place(at, unit, count);
      auto part = read_direct(filesystems[p.shard]->path(name), p.shard_offset, step);
      out.insert(out.end(), part.begin(), part.end());
      at += step;
    }
    return out;
  }
  /// Reads through O_DIRECT (what the device holds, not ext4's page cache of the file).
  static std::vector<std::uint8_t> read_direct(const std::string& path, std::uint64_t at, std::uint64_t n) {
    const std::uint64_t lo = at / 4096 * 4096, hi = (at + n + 4095) / 4096 * 4096;
    Buffer b(hi - lo);
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    REQUIRE(fd >= 0);
    std::uint64_t done = 0;
    while (done < hi - lo) {
      const ssize_t got = ::pread(fd, b.bytes() + done, hi - lo - done, static_cast<off_t>(lo + done));
      if (got <= 0) break;  // end of file
      done += static_cast<std::uint64_t>(got);
    }
    ::close(fd);
    REQUIRE(done >= at + n - lo);
    return std::vector<std::uint8_t>(b.bytes() + (at - lo), b.bytes() + (at - lo) + n);
  }

  std::vector<std::unique_ptr<ScratchFilesystem>> filesystems;
  std::unique_ptr<SoftStripedNvme> stack;
};

IoResult run(StripedMixedRuntime& rt, const std::vector<IoRequest>& requests) {
  return tutti::testing::run_to_completion(rt, requests, 30 * kSecond);
}

std::string uri(const std::string& name, const std::string& devs, std::uint64_t unit) {
  return fmt::format("striped://{}?devs={}&unit={}", name, devs, unit);
}

}  // namespace

TEST_CASE(
    "the striped resolver refuses a missing shard, a shard smaller than one unit, a unit that is not a multiple "
    "of a shard's LBA size, and malformed URIs, naming the field, the value and the limit") {
  Rig rig({4096, 512});  // different LBA formats: 4096-byte and 512-byte LBAs
  auto& rt = rig.rt();
  const std::string devs = rig.write_shards("kv", {1 << 20, 1 << 20});
  const std::string a = rig.filesystems[0]->path("kv"), b = rig.filesystems[1]->path("kv");
  const auto code = [&](const std::string& u) {
    auto t = rt.open(u);
    if (t.is_ok()) {
      CHECK(rt.close(*t).is_ok());
      return std::make_pair(StatusCode::OK, std::string());
    }
    return std::make_pair(t.status().code(), t.status().to_string());
  };
  auto [missing, missing_text] = code(uri("kv", a + "," + rig.filesystems[1]->path("absent"), 65536));
  CHECK(missing == StatusCode::NOT_FOUND);
  CHECK(missing_text.find("devs[1]") != std::string::npos);
  rig.write_shards("tiny", {1 << 20, 4096});
  auto [tiny, tiny_text] =
      code(uri("tiny", rig.filesystems[0]->path("tiny") + "," + rig.filesystems[1]->path("tiny"), 65536));
  CHECK(tiny == StatusCode::INVALID_ARGUMENT);
  CHECK(tiny_text.find("devs[1]") != std::string::npos);
  CHECK(tiny_text.find("4096 bytes, less than one unit of 65536") != std::string::npos);
  auto [odd, odd_text] = code(uri("kv", devs, 1536));  // a multiple of 512, not of 4096
  CHECK(odd == StatusCode::INVALID_ARGUMENT);
  CHECK(odd_text.find("devs[0]") != std::string::npos);
  CHECK(odd_text.find("unit = 1536 bytes is not a multiple of its 4096-byte LBA size") != std::string::npos);
  CHECK(code(uri("kv", a, 65536)).first == StatusCode::INVALID_ARGUMENT);          // one shard, two controllers
  CHECK(code("striped://kv?devs=" + devs).first == StatusCode::INVALID_ARGUMENT);  // no unit
  CHECK(code(uri("kv", devs, 0)).first == StatusCode::INVALID_ARGUMENT);           // unit 0
  CHECK(code("striped://kv?devs=" + devs + "&unit=4k").first == StatusCode::INVALID_ARGUMENT);  // not a number
  CHECK(code("striped://kv?unit=4096").first == StatusCode::INVALID_ARGUMENT);                  // no devs
  CHECK(code(uri("kv", devs, 4096) + "&stripe=2").first == StatusCode::INVALID_ARGUMENT);       // unknown key
  CHECK(code("striped://?devs=" + devs + "&unit=4096").first == StatusCode::INVALID_ARGUMENT);  // no NAME
  CHECK(code(uri("kv", "relative," + b, 4096)).first == StatusCode::INVALID_ARGUMENT);          // relative path
  // A 4096-byte unit suits both LBA formats; the logical size is 2 x the shortest shard in whole units.
  rig.write_shards("uneven", {(1 << 20) + 5000, 3 << 20});
  auto t = rt.open(uri("uneven", rig.filesystems[0]->path("uneven") + "," + rig.filesystems[1]->path("uneven"), 65536));
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  CHECK(rt.target_size(*t).value() == 2 * (1 << 20));
  CHECK(rt.close(*t).is_ok());
  // A ',' inside a shard path is written %2C.
  rig.write_shards("a,b", {1 << 20, 1 << 20});
  auto comma = rt.open(uri("comma", rig.filesystems[0]->path("a%2Cb") + "," + rig.filesystems[1]->path("a%2Cb"), 4096));
  REQUIRE_MESSAGE(comma.is_ok(), comma.status().to_string());
  CHECK(rt.close(*comma).is_ok());
}

TEST_CASE("striped targets over 2 and 3 ext4 images read and write byte-exact, in batches mixed with plain targets") {
  for (std::vector<std::uint32_t> sectors :
       {std::vector<std::uint32_t>{4096, 512}, std::vector<std::uint32_t>{4096, 4096, 4096}}) {
    CAPTURE(sectors.size());
    Rig rig(sectors);
    auto& rt = rig.rt();
    const std::uint64_t shard = 2 << 20;
    const std::string kv = rig.write_shards("kv", std::vector<std::uint64_t>(sectors.size(), shard));
    const std::string v = rig.write_shards("v", std::vector<std::uint64_t>(sectors.size(), shard));
    const std::string plain = rig.filesystems[0]->path("plain");
    tutti::testing::write_pattern_file(plain, 99, 1 << 20);
    Buffer buffer(16 << 20);
    auto m = rt.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    auto k = rt.open(uri("k", kv, 64 << 10), OpenOptions{true, true, false});
    REQUIRE_MESSAGE(k.is_ok(), k.status().to_string());
    auto vt = rt.open(uri("v", v, 4096));
    REQUIRE_MESSAGE(vt.is_ok(), vt.status().to_string());
    auto p = rt.open("file://" + plain);
    REQUIRE_MESSAGE(p.is_ok(), p.status().to_string());
    const std::uint64_t size = sectors.size() * shard;
    CHECK(rt.target_size(*k).value() == size);
    // One batch: the whole of k, a mid-unit piece of v, and the plain file: ONE submit launch for
    // both striped targets over every controller, ONE for the plain target (one per DataPath).
    const std::uint64_t striped_launches = rt.datapath<0>().launches();
    const auto plain_submits = rt.datapath<1>().submit_time_split().submits;
    const std::vector<IoRequest> mixed{IoRequest{Direction::READ, *m, 0, *k, 0, size},
                                       IoRequest{Direction::READ, *m, 8 << 20, *vt, 12288, 200 << 10},
                                       IoRequest{Direction::READ, *m, 12 << 20, *p, 0, 1 << 20}};
    auto submitted = rt.submit(mixed);
    for (const Status& state : submitted.initial_states) REQUIRE_MESSAGE(state.is_ok(), state.to_string());
    CHECK(rt.datapath<0>().launches() - striped_launches == 1);
    CHECK(rt.datapath<1>().submit_time_split().submits == plain_submits + 1);
    auto waited = rt.wait(submitted.io, 30 * kSecond);
    REQUIRE_MESSAGE(waited.is_ok(), waited.status().to_string());
    REQUIRE(rt.release(submitted.io).is_ok());
    const IoResult r = waited.value();
    REQUIRE_MESSAGE(r.status.is_ok(), r.status.to_string());
    CHECK(r.confirmed_bytes == size + (200 << 10) + (1 << 20));
    CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + size) == rig.expected("kv", 64 << 10, 0, size));
    CHECK(std::vector<std::uint8_t>(buffer.bytes() + (8 << 20), buffer.bytes() + (8 << 20) + (200 << 10)) ==
          rig.expected("v", 4096, 12288, 200 << 10));
    CHECK(std::vector<std::uint8_t>(buffer.bytes() + (12 << 20), buffer.bytes() + (13 << 20)) ==
          tutti::testing::read_file(plain, 0, 1 << 20));
    // A write starting and ending mid-unit, then read back through NVMe and through O_DIRECT.
    const auto pattern = tutti::testing::pattern(7, 0, 300 << 10);
    std::memcpy(buffer.data, pattern.data(), pattern.size());
    IoResult w = run(rt, {IoRequest{Direction::WRITE, *m, 0, *k, 20 << 10, 300 << 10}});
    REQUIRE_MESSAGE(w.status.is_ok(), w.status.to_string());
    std::memset(buffer.data, 0xEE, buffer.size);
    IoResult back = run(rt, {IoRequest{Direction::READ, *m, 4096, *k, 20 << 10, 300 << 10}});
    REQUIRE(back.status.is_ok());
    CHECK(std::vector<std::uint8_t>(buffer.bytes() + 4096, buffer.bytes() + 4096 + (300 << 10)) == pattern);
    CHECK(rt.close(*k).is_ok());  // flush_on_close: one NVMe Flush per shard
    CHECK(rig.expected("kv", 64 << 10, 20 << 10, 300 << 10) == pattern);
    for (const auto& d : rig.stack->devices) CHECK(d->counters().flush_commands >= 1);
    CHECK(rt.close(*vt).is_ok());
    CHECK(rt.close(*p).is_ok());
    CHECK(rt.unregister_memory(*m).is_ok());
  }
}
