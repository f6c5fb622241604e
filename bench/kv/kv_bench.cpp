// kv_bench: what the KV block store costs over the raw runtime, in the same run, on the same files.
//
//   kv_bench [--dir DIR] [--blocks N] [--block-bytes BYTES] [--layers L] [--repeat R]
//            [--memory host|device] [--lookup-keys N] [--recovery-blocks N] [--json FILE]
//
// 1. Layer load: a store of L layers holds N blocks (default 128 blocks of 1 MiB per layer: a
//    32k-token prefix of 256-token blocks of an 8B model, 256 x 8 KV heads x 128 x 2 bytes x 2 (K, V)).
//    Each repetition loads layer 0 of all N blocks into --memory (host: page-aligned host memory;
//    device: GPU memory, cuda profile only, verified by the checksum kernels; the uring DataPath stages
//    through its pinned ring on both sides) (a) through raw runtime submits
//    (N READ requests at the blocks' slot offsets, one submit, one wait) and (b) through
//    KvStore::load + wait (one submit, then XXH3 verification of every piece); the sides alternate,
//    the medians are reported with the ratio store / raw. Then the same with the store reopened
//    with options.unsafe_skip_verification. O_DIRECT: the page cache plays no part.
// 2. Lookup: ns per key of KvStore::lookup over the N stored keys (writer: the in-memory index) and
//    over --lookup-keys keys in a read-only open (LMDB read transaction per call).
// 3. Recovery: a store of --recovery-blocks one-layer 4 KiB blocks whose index is filled directly
//    (kv::Index, records of the zero-filled slots, so they verify), then the time KvStore::open takes
//    (LMDB open, the scan of every record, the slot table) as a writer, and as a reader.
// Files go to a fresh DIR/tutti-kv-bench-XXXXXX (default DIR /var/tmp), removed at the end.
// Prints one line per figure; --json writes them too. Exit status 0, 1 when a load failed, 2 on a bad flag.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/accel/memory.hpp>
#include <tutti/kv/kv.hpp>
#include <tutti/presets.hpp>

#include "cli_checks.hpp"

using namespace tutti;
using Store = kv::KvStore<UringRuntime>;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;

struct Settings {
  std::string dir = "/var/tmp";
  std::string memory = "host";
  std::uint64_t blocks = 128;
  std::uint64_t block_bytes = std::uint64_t{1} << 20;
  std::uint32_t layers = 2;
  std::uint32_t repeat = 15;
  std::uint64_t lookup_keys = 100000;
  std::uint64_t recovery_blocks = 1000000;
  std::string json;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
/// CPU time of the whole process (user + system, every thread), seconds: what a figure cost in
/// CPU, which the shared machine's load does not inflate the way it inflates wall time.
double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
std::string key_of(std::uint64_t i) {
  std::string k(32, '\0');
  std::memcpy(k.data(), &i, 8);
  std::memcpy(k.data() + 8, "kv-bench-block-key-of-32-bytes", 24);
  return k;
}

/// The scratch directory this run made ("" before it exists): removed on every exit.
std::string g_scratch;

[[noreturn]] void die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "kv_bench: %s: %s\n", what.c_str(), s.to_string().c_str());
  std::error_code ignored;
  if (!g_scratch.empty()) std::filesystem::remove_all(g_scratch, ignored);
  std::exit(1);
}

kv::Namespace bench_namespace(std::uint32_t layers, std::uint64_t piece) {
  kv::Namespace ns;
  ns.model = "kv-bench";
  ns.dtype = "bfloat16";
  ns.block_tokens = 256;
  ns.layers = layers;
  ns.piece_bytes = {piece};
  ns.kv_split = false;
  ns.hash_algorithm = "bench";
  return ns;
}

/// The load's destination: page-aligned host memory, or device memory (accel::allocate_device).
struct Memory {
  Memory(std::size_t n, bool on_device) : size(n), device(on_device) {
    if (device) {
      auto p = accel::allocate_device(n);
      if (!p) die("allocate device memory", p.status());
      data = static_cast<std::uint8_t*>(*p);
    } else {
      data = static_cast<std::uint8_t*>(std::aligned_alloc(4096, n));
    }
  }
  ~Memory() {
    if (device)
      accel::free_device(data);
    else
      std::free(data);
  }
  MemoryView view() const { return {data, size, device ? MemoryKind::DEVICE : MemoryKind::HOST, device ? 0 : -1}; }
  std::uint8_t* data;
  std::size_t size;
  bool device;
};

/// One timed raw load: N READs of block_bytes at slot i's offset of layer file 0, one submit.
double raw_load(UringRuntime& rt, TargetHandle target, MemoryHandle memory, const Settings& s, std::uint64_t slot_bytes,
                double* cpu) {
  std::vector<IoRequest> requests;
  for (std::uint64_t i = 0; i < s.blocks; ++i)
    requests.push_back({Direction::READ, memory, i * s.block_bytes, target, i * slot_bytes, s.block_bytes});
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto outcome = rt.submit(requests);
  if (outcome.accepted != requests.size()) die("raw submit", outcome.initial_states[0]);
  auto r = rt.wait(outcome.io, 60 * kSecond);
  if (!r || !r->status.is_ok()) die("raw wait", r ? r->status : r.status());
  const double t = seconds_since(t0);
  *cpu = cpu_seconds() - c0;
  (void)rt.release(outcome.io);
  return t;
}

/// One timed store load of layer 0 of every block (submit, wait, verification).
double store_load(Store& store, MemoryHandle memory, const Settings& s, const std::vector<std::string_view>& keys,
                  std::uint64_t* verified, double* cpu) {
  std::vector<kv::Piece> pieces;
  for (std::uint64_t i = 0; i < s.blocks; ++i) pieces.push_back({memory, i * s.block_bytes, s.block_bytes});
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto io = store.load(keys, 0, pieces);
  if (!io) die("store load", io.status());
  auto r = store.wait(*io, 60 * kSecond);
  if (!r || !r->status.is_ok()) die("store wait", r ? r->status : r.status());
  const double t = seconds_since(t0);
  *cpu = cpu_seconds() - c0;
  *verified += r->verified_bytes;
  return t;
}

struct LoadFigures {
  double raw_s = 0, store_s = 0, raw_cpu_s = 0, store_cpu_s = 0;
  std::uint64_t verified_bytes = 0;
};

LoadFigures measure_loads(UringRuntime& rt, const Settings& s, const std::string& dir, const kv::Namespace& ns,
                          bool verify, const std::vector<std::string_view>& keys) {
  kv::StoreOptions o;
  o.unsafe_skip_verification = !verify;
  auto opened = Store::open(rt, dir, ns, o);
  if (!opened) die("open", opened.status());
  Store& store = **opened;
  Memory buffer(s.blocks * s.block_bytes, s.memory == "device");
  auto memory = store.register_memory(buffer.view());
  if (!memory) die("register", memory.status());
  auto target = rt.open("file://" + dir + "/" + kv::Layout::file_name(0));
  if (!target) die("raw open", target.status());
  std::vector<double> raw, kv, raw_cpu, kv_cpu;
  LoadFigures f;
  double cpu = 0;
  (void)store_load(store, *memory, s, keys, &f.verified_bytes, &cpu);  // warm-up, both sides
  (void)raw_load(rt, *target, *memory, s, store.layout().slot_bytes, &cpu);
  f.verified_bytes = 0;
  for (std::uint32_t r = 0; r < s.repeat; ++r) {
    raw.push_back(raw_load(rt, *target, *memory, s, store.layout().slot_bytes, &cpu));
    raw_cpu.push_back(cpu);
    kv.push_back(store_load(store, *memory, s, keys, &f.verified_bytes, &cpu));
    kv_cpu.push_back(cpu);
  }
  (void)rt.close(*target);
  f.raw_s = median(raw);
  f.store_s = median(kv);
  f.raw_cpu_s = median(raw_cpu);
  f.store_cpu_s = median(kv_cpu);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"kv_bench: the KV block store against raw runtime submits (docs/benchmarks.md)"};
  app.add_option("--dir", s.dir, "where the scratch directory tutti-kv-bench-XXXXXX is made (and removed)")
      ->check(bench::kNotEmpty)
      ->capture_default_str();
  app.add_option("--blocks", s.blocks, "blocks of the layer load")
      ->check(bench::kDecimal)
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--block-bytes", s.block_bytes, "bytes of one block of one layer (multiple of 4096)")
      ->check(bench::kDecimal)
      ->check(CLI::Range(4096, 1 << 30))
      ->capture_default_str();
  app.add_option("--layers", s.layers, "layers of the store (layer 0 is loaded)")
      ->check(bench::kDecimal)
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--repeat", s.repeat, "repetitions per side (medians reported)")
      ->check(bench::kDecimal)
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--memory", s.memory, "where the layer load lands: host, or device (cuda profile)")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  app.add_option("--lookup-keys", s.lookup_keys, "keys per lookup in the reader")
      ->check(bench::kDecimal)
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  app.add_option("--recovery-blocks", s.recovery_blocks, "blocks of the recovery measurement (0 skips it)")
      ->check(bench::kDecimal)
      ->capture_default_str();
  app.add_option("--json", s.json, "also write the figures to this file");
  if (const int rc = bench::parse_flags(app, argc, argv); rc >= 0) return rc;
  if (s.block_bytes % 4096 != 0) {
    std::fprintf(stderr, "--block-bytes = %llu is not a multiple of 4096\n",
                 static_cast<unsigned long long>(s.block_bytes));
    return 2;
  }
  if (s.memory == "device" && accel::kProfile != accel::Profile::cuda) {
    std::fprintf(stderr, "--memory device needs the cuda profile (meson setup -Daccelerator=cuda)\n");
    return 2;
  }
  std::string scratch = s.dir + "/tutti-kv-bench-XXXXXX";
  if (::mkdtemp(scratch.data()) == nullptr) {
    std::fprintf(stderr, "cannot make a scratch directory in --dir %s: %s\n", s.dir.c_str(), std::strerror(errno));
    return 2;
  }
  s.dir = scratch;  // only this directory is written, and removed at the end (also by die())
  g_scratch = scratch;
  std::error_code ignored;
  nlohmann::json out;
  auto made = make_uring_runtime();
  if (!made) die("uring runtime", made.status());
  UringRuntime rt = std::move(made).value();

  // --- 1. the layer load --------------------------------------------------------------------------
  const std::string dir = s.dir + "/layers";
  const auto ns = bench_namespace(s.layers, s.block_bytes);
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < s.blocks; ++i) keys.push_back(key_of(i));
  const std::vector<std::string_view> keyviews(keys.begin(), keys.end());
  {
    kv::StoreOptions o;
    o.capacity_bytes = s.blocks * s.block_bytes * s.layers;
    auto opened = Store::open(rt, dir, ns, o);
    if (!opened) die("create", opened.status());
    Store& store = **opened;
    Memory buffer(s.blocks * s.block_bytes, false);
    for (std::size_t i = 0; i < buffer.size; i += 8) {
      const std::uint64_t v = i * 0x9E3779B97F4A7C15ull;
      std::memcpy(buffer.data + i, &v, 8);
    }
    auto memory = store.register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
    if (!memory) die("register", memory.status());
    std::vector<kv::Piece> pieces;
    for (std::uint64_t i = 0; i < s.blocks; ++i) pieces.push_back({*memory, i * s.block_bytes, s.block_bytes});
    for (std::uint32_t l = 0; l < s.layers; ++l) {
      auto io = store.store(keyviews, l, pieces);
      if (!io) die("store", io.status());
      auto r = store.wait(*io, 120 * kSecond);
      if (!r || !r->status.is_ok()) die("store wait", r ? r->status : r.status());
    }
    auto committed = store.commit(keyviews, 120 * kSecond);
    if (!committed) die("commit", committed.status());
    for (const auto& st : *committed)
      if (!st.is_ok()) die("commit", st);
    // Lookup in the writer: the in-memory index.
    const int rounds = 2000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r)
      if (store.lookup(keyviews).value() != s.blocks) die("lookup", error(StatusCode::INTERNAL, "short prefix"));
    const double ns_per_key = seconds_since(t0) * 1e9 / (double(rounds) * double(s.blocks));
    fmt::print("lookup (writer) : {:.0f} ns per key ({} keys per call, in-memory index)\n", ns_per_key, s.blocks);
    out["lookup_writer_ns_per_key"] = ns_per_key;
  }
  const double gb = double(s.blocks * s.block_bytes) / 1e9;
  for (bool verify : {true, false}) {
    const LoadFigures f = measure_loads(rt, s, dir, ns, verify, keyviews);
    const double ratio = f.raw_s / f.store_s;
    fmt::print(
        "layer load {:<4} : {} blocks x {} bytes into {} memory: raw {:.2f} ms ({:.2f} GB/s, cpu {:.2f} ms), store "
        "{:.2f} ms ({:.2f} GB/s, cpu {:.2f} ms) -> store/raw throughput = {:.3f}; {} bytes verified\n",
        verify ? "on" : "off", s.blocks, s.block_bytes, s.memory, f.raw_s * 1e3, gb / f.raw_s, f.raw_cpu_s * 1e3,
        f.store_s * 1e3, gb / f.store_s, f.store_cpu_s * 1e3, ratio, f.verified_bytes);
    auto& j = out[verify ? "load_verify_on" : "load_verify_off"];
    j = {{"raw_ms", f.raw_s * 1e3},
         {"store_ms", f.store_s * 1e3},
         {"raw_gb_per_s", gb / f.raw_s},
         {"store_gb_per_s", gb / f.store_s},
         {"raw_cpu_ms", f.raw_cpu_s * 1e3},
         {"store_cpu_ms", f.store_cpu_s * 1e3},
         {"memory", s.memory},
         {"ratio", ratio},
         {"verified_bytes", f.verified_bytes},
         {"blocks", s.blocks},
         {"block_bytes", s.block_bytes},
         {"repeat", s.repeat}};
  }
  {  // Lookup in a reader: one LMDB read transaction per call.
    kv::StoreOptions o;
    o.read_only = true;
    auto opened = Store::open(rt, dir, ns, o);
    if (!opened) die("open read-only", opened.status());
    std::vector<std::string> many;
    for (std::uint64_t i = 0; i < s.lookup_keys; ++i) many.push_back(key_of(i % s.blocks));
    const std::vector<std::string_view> manyviews(many.begin(), many.end());
    const auto t0 = std::chrono::steady_clock::now();
    const int rounds = 5;
    for (int r = 0; r < rounds; ++r) (void)(*opened)->lookup(manyviews);
    const double ns_per_key = seconds_since(t0) * 1e9 / (double(rounds) * double(s.lookup_keys));
    fmt::print("lookup (reader) : {:.0f} ns per key ({} keys per call, LMDB read transaction)\n", ns_per_key,
               s.lookup_keys);
    out["lookup_reader_ns_per_key"] = ns_per_key;
  }

  // --- 3. recovery ---------------------------------------------------------------------------------
  if (s.recovery_blocks > 0) {
    const std::string rdir = s.dir + "/recovery";
    const auto rns = bench_namespace(1, 4096);
    kv::StoreOptions o;
    o.capacity_bytes = s.recovery_blocks * 4096;
    const auto t_create = std::chrono::steady_clock::now();
    {
      auto created = Store::open(rt, rdir, rns, o);
      if (!created) die("create the recovery store", created.status());
    }
    const double create_s = seconds_since(t_create);
    {  // Fill the index directly: block i in slot i, whose 4096 zero bytes the record's checksum names.
      auto index = kv::Index::open(rdir, false, std::uint64_t{8} << 30);
      if (!index) die("index", index.status());
      std::vector<std::uint8_t> zeros(4096, 0);
      const std::uint64_t zero_sum = kv::host_checksum(zeros.data(), zeros.size());
      for (std::uint64_t first = 0; first < s.recovery_blocks; first += 100000) {
        kv::Index::Batch batch;
        for (std::uint64_t i = first; i < std::min(first + 100000, s.recovery_blocks); ++i) {
          kv::BlockRecord r{static_cast<std::uint32_t>(i), i + 1, {4096}, {zero_sum}};
          const std::string k = key_of(i);
          batch.puts.emplace_back(k, kv::encode_record(k, r, 1));
        }
        if (Status st = (*index)->apply(batch); !st.is_ok()) die("fill the index", st);
      }
      std::string next(8, '\0');
      const std::uint64_t g = s.recovery_blocks + 1;
      std::memcpy(next.data(), &g, 8);
      kv::Index::Batch meta;
      meta.meta.emplace_back("next_generation", next);
      if (Status st = (*index)->apply(meta); !st.is_ok()) die("fill the index", st);
    }
    for (bool reader : {false, true}) {
      kv::StoreOptions ro;
      ro.read_only = reader;
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      auto opened = Store::open(rt, rdir, rns, ro);
      const double open_s = seconds_since(t0), open_cpu_s = cpu_seconds() - c0;
      if (!opened) die("reopen", opened.status());
      const auto stats = (*opened)->statistics();
      if (!reader && stats.visible_blocks != s.recovery_blocks)
        die("recovery",
            error(StatusCode::INTERNAL, "{} blocks recovered of {}", stats.visible_blocks, s.recovery_blocks));
      // One recovered block loads and verifies.
      Memory one(4096, false);
      auto memory = (*opened)->register_memory({one.data, 4096, MemoryKind::HOST, -1});
      const std::string last = key_of(s.recovery_blocks - 1);
      const std::vector<std::string_view> k{last};
      auto io = (*opened)->load(k, 0, std::vector<kv::Piece>{{*memory, 0, 4096}});
      auto r = io ? (*opened)->wait(*io, 60 * kSecond) : Result<kv::LayerResult>(io.status());
      if (!r || !r->status.is_ok()) die("load a recovered block", r ? r->status : r.status());
      fmt::print(
          "recovery ({}) : open of a store of {} blocks in {:.3f} s, cpu {:.3f} s ({:.0f} ns per block); its creation "
          "(files fully written) took {:.1f} s\n",
          reader ? "reader" : "writer", s.recovery_blocks, open_s, open_cpu_s, open_s * 1e9 / double(s.recovery_blocks),
          create_s);
      out[reader ? "recovery_reader_open_cpu_s" : "recovery_writer_open_cpu_s"] = open_cpu_s;
      out[reader ? "recovery_reader_open_s" : "recovery_writer_open_s"] = open_s;
    }
    out["recovery_blocks"] = s.recovery_blocks;
  }
  if (!s.json.empty()) std::ofstream(s.json) << out.dump(2) << "\n";
  std::filesystem::remove_all(s.dir, ignored);
  return 0;
}
