// The layer-wise example's summary logic, shared by the host and CUDA builds: the verdict of what bounded
// the pipeline (pipeline.hpp), the per-source tensor counts, the spread over repeated runs and the verdict
// drawn from a ratio's spread (spread.hpp), progress in logs (progress.hpp), the built-in model shapes
// (model_shapes.hpp) and what the data folder's file system is (data_files.hpp).
#include <sys/statfs.h>
#include <linux/magic.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

#include <real_files.hpp>

#include "layerwise_kv_overlap/data_files.hpp"
#include "layerwise_kv_overlap/model_shapes.hpp"
#include "layerwise_kv_overlap/pipeline.hpp"
#include "layerwise_kv_overlap/progress.hpp"
#include "layerwise_kv_overlap/spread.hpp"

using namespace layerwise;

namespace {
constexpr std::uint64_t kMs = 1'000'000;  // ns

/// The host profile's figures from its time split (main.cpp's host_bound_figures).
BoundFigures host_figures(std::uint64_t compute_ms, std::uint64_t read_wait_ms, std::uint64_t write_wait_ms) {
  BoundFigures f;
  f.layers = 80;
  f.compute_ns = compute_ms * kMs;
  f.read_wait_ns = read_wait_ms * kMs;
  f.write_wait_ns = write_wait_ms * kMs;
  f.compute_waited_ns = f.read_wait_ns + f.write_wait_ns;
  f.pipeline_ns = f.compute_ns + f.compute_waited_ns;
  f.restore_alone_ns = 500 * kMs;
  return f;
}
}  // namespace

TEST_CASE("a pipeline whose compute waited mostly for writes is write-bound") {
  // The figures a fresh-user trial reported: compute 205 ms, waiting for reads 30 ms, for writes 1545 ms.
  const BoundFigures f = host_figures(205, 30, 1545);
  CHECK(pipeline_bound(f) == Bound::WRITES);
  CHECK(std::string(bound_name(pipeline_bound(f))) == "writes");
  CHECK(layer_bound_line(f).find(": write-bound: ") != std::string::npos);
  // Round figures, so the printed per-layer values do not depend on how a tie is rounded.
  const std::string line = layer_bound_line(host_figures(200, 40, 1560));
  CHECK(line ==
        "restore alone 6.25 ms, compute 2.50 ms, pipeline 22.50 ms: write-bound: compute waited 20.00 ms for IO, "
        "800% of its own time (more than 10%: IO stretched the pipeline); the pipeline's thread waited 0.50 ms for "
        "reads, 19.50 ms for writes");
}

TEST_CASE("the verdict prints the share its rule tests: compute's wait over compute's own time") {
  // A memfs run of a fresh-user trial: 2 ms of compute, 0.31 ms of waiting, printed as "5% of the pipeline"
  // beside a rule on the share of compute (15.5%): the two figures now are one.
  BoundFigures f = host_figures(200, 1, 30);  // per layer: 2.5 ms compute, 0.3875 ms waited = 15.5%
  CHECK(pipeline_bound(f) == Bound::WRITES);
  CHECK(layer_bound_line(f).find("compute waited 0.39 ms for IO, 15.5% of its own time (more than 10%") !=
        std::string::npos);
  f = host_figures(740, 10, 64);  // 74 ms of 740: exactly the limit
  CHECK(pipeline_bound(f) == Bound::COMPUTE);
  CHECK(layer_bound_line(f).find("10.0% of its own time (10% or less: IO hides behind compute)") != std::string::npos);
  f = host_figures(740, 10, 65);  // 75 ms: 10.1%, printed with its decimal so it cannot read as "10%"
  CHECK(layer_bound_line(f).find("10.1% of its own time (more than 10%") != std::string::npos);
}

TEST_CASE("a pipeline whose compute waited mostly for reads is read-bound") {
  const BoundFigures f = host_figures(160, 900, 40);
  CHECK(pipeline_bound(f) == Bound::READS);
  CHECK(layer_bound_line(f).find(": read-bound: ") != std::string::npos);
}

TEST_CASE("a pipeline whose waits are at most a tenth of its compute is compute-bound") {
  CHECK(pipeline_bound(host_figures(740, 10, 64)) == Bound::COMPUTE);  // 74 ms = 10% of 740: still hidden
  CHECK(pipeline_bound(host_figures(740, 10, 65)) == Bound::WRITES);   // 75 ms: IO stretched the pipeline
  CHECK(layer_bound_line(host_figures(740, 10, 64)).find(": compute-bound: ") != std::string::npos);
  CHECK(layer_bound_line(host_figures(740, 10, 64)).find("IO hides behind compute") != std::string::npos);
  BoundFigures no_compute = host_figures(0, 30, 0);  // --compute-ms 0: any wait is IO-bound
  CHECK(pipeline_bound(no_compute) == Bound::READS);
  CHECK(layer_bound_line(no_compute).find("for IO, with no compute time (more than 10%") != std::string::npos);
}

TEST_CASE("the CUDA build's verdict takes compute's wait from the compute stream, which IO from the host thread") {
  // An H200 run with 8 ms of compute per layer: the GPU waited 12.7 ms in all while the host thread,
  // which waits for read(L+1) while the GPU computes L, waited far longer: compute-bound all the same.
  BoundFigures f;
  f.layers = 80;
  f.compute_name = "GPU compute";
  f.pipeline_ns = 755 * kMs;
  f.compute_ns = 741 * kMs;
  f.compute_waited_ns = 13 * kMs;
  f.read_wait_ns = 400 * kMs;
  f.write_wait_ns = 255 * kMs;
  f.restore_alone_ns = 481 * kMs;
  CHECK(pipeline_bound(f) == Bound::COMPUTE);
  CHECK(layer_bound_line(f).find("GPU compute 9.26 ms, pipeline 9.44 ms: compute-bound") != std::string::npos);
  f.compute_ns = 188 * kMs;  // 2 ms per layer: the GPU idles, the host waited longer for reads than writes
  f.compute_waited_ns = 543 * kMs;
  CHECK(pipeline_bound(f) == Bound::READS);
}

TEST_CASE("no compute and no wait reads as compute-bound, not as a division by zero") {
  BoundFigures f;
  CHECK(pipeline_bound(f) == Bound::COMPUTE);
  CHECK(layer_bound_line(f).find("0% of its own time (10% or less") != std::string::npos);
}

TEST_CASE("the simulated compute's note names every reason a layer took longer than --compute-ms") {
  CHECK(compute_note(2.0, 1.0, 2.1) == "");  // on time: within 10% of what was asked
  CHECK(compute_note(2.0, 1.0, 4.0) == " (the thread woke 2.00 ms late: the machine is busy)");
  CHECK(compute_note(2.0, 3.0, 3.1) == " (producing the K/V alone takes longer than --compute-ms)");
  // Producing took a little longer than asked, and the thread woke far later still: both are said (a run
  // under load printed only the first, for 19.73 ms against 2.08 ms of producing).
  CHECK(compute_note(2.0, 2.08, 19.73) ==
        " (producing the K/V alone takes longer than --compute-ms; the thread woke 17.65 ms late: the machine is "
        "busy)");
}

TEST_CASE("every checked tensor is counted once, under its source, and merged counts add up") {
  Report report;
  report.count_tensor(true, "restore", 0, 0, 0);
  report.count_tensor(true, "pread", 0, 0, 1);
  report.count_tensor(false, "pread", 2, 1, 1);
  Report helper;
  helper.count_tensor(true, "restore", 1, 0, 0);
  helper.count_tensor(true, "written", 1, 3, 0);
  report.merge_checks(helper);
  CHECK(report.verified_tensors == 5);
  CHECK(report.mismatched_tensors == 1);
  REQUIRE(report.mismatches.size() == 1);
  CHECK(report.mismatches[0] == "pread layer 2 chunk 1 V");
  CHECK(report.checks_by_source() == "restore 2, pread 2, written 1");
}

TEST_CASE("only the first 8 mismatches are named, all are counted") {
  Report report;
  for (std::uint32_t l = 0; l < 20; ++l) report.count_tensor(false, "pipeline", l, 0, 0);
  Report other;
  other.count_tensor(false, "written", 0, 0, 0);
  report.merge_checks(other);
  CHECK(report.mismatched_tensors == 21);
  CHECK(report.verified_tensors == 21);
  CHECK(report.mismatches.size() == 8);
}

TEST_CASE("a spread is the median with the smallest and largest value, printed median [min-max]") {
  const Spread three = spread_of({1.09, 2.08, 1.00});  // the ratios of three runs in a fresh-user trial
  CHECK(three.median == doctest::Approx(1.09));
  CHECK(three.min == doctest::Approx(1.00));
  CHECK(three.max == doctest::Approx(2.08));
  CHECK(format_spread(three, 2, "x") == "1.09x [1.00x-2.08x]");
  CHECK(spread_of({4.0, 1.0, 3.0, 2.0}).median == doctest::Approx(2.5));  // an even count: the middle two's mean
  CHECK(format_spread(spread_of({0.95}), 2) == "0.95");                   // one run: no brackets
  CHECK(spread_of({}).runs == 0);
  CHECK(median_index({30.0, 10.0, 20.0}) == 2);    // the run whose value is the median
  CHECK(median_index({4.0, 1.0, 3.0, 2.0}) == 3);  // an even count: the lower middle (2.0)
}

TEST_CASE("a ratio whose runs' range crosses 1x is inconclusive, not beat or slower, and the range is shown") {
  // Three runs of a trial: tutti/pread 1.30x, 0.90x, 1.50x. The median says "beat"; one run was slower.
  const Spread crossing = spread_of({1.30, 0.90, 1.50});
  CHECK(compare_ratio(crossing) == Comparison::INCONCLUSIVE);
  CHECK(std::string(comparison_name(compare_ratio(crossing))) == "inconclusive");
  CHECK(comparison_words(crossing, "pread 1 thread") ==
        "restore against pread 1 thread inconclusive: 1.30x [0.90x-1.50x] over 3 runs, faster in some, slower in "
        "others");
  CHECK(compare_ratio(spread_of({0.70, 1.10, 0.80})) == Comparison::INCONCLUSIVE);  // a "slower" median, one run faster
  // Every run on one side of 1x: the median decides, and the range is printed with it.
  CHECK(comparison_words(spread_of({1.31, 1.20, 1.40}), "pread 1 thread") ==
        "restore beat pread 1 thread by 1.31x [1.20x-1.40x]");
  CHECK(comparison_words(spread_of({0.80, 0.70, 0.90}), "pread from 6 threads") ==
        "restore was slower than pread from 6 threads (0.80x [0.70x-0.90x])");
  CHECK(compare_ratio(spread_of({1.00, 1.02, 1.08})) == Comparison::MATCHED);  // median 1.02, never slower
  // A range across 1x but within 5% either side is a match, not a doubt.
  CHECK(comparison_words(spread_of({1.01, 0.98, 1.03}), "pread 1 thread") ==
        "restore matched pread 1 thread (1.01x [0.98x-1.03x])");
  // One run has no range: its ratio decides, printed alone.
  CHECK(comparison_words(spread_of({1.31}), "pread 1 thread") == "restore beat pread 1 thread by 1.31x");
  CHECK(compare_ratio(spread_of({0.95})) == Comparison::SLOWER);
  CHECK(compare_ratio(spread_of({1.05})) == Comparison::BEAT);
}

TEST_CASE("progress in a log is a line every few seconds and one at the end, never a carriage return") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  std::uint64_t now = 0;
  {
    Progress progress("writing", 100, Progress::Unit::items, out, /*terminal=*/0, [&] { return now; });
    for (std::uint64_t done = 1; done < 100; ++done) {
      now += 100'000'000;  // 0.1 s per step: 9.9 s in all
      progress.update(done);
    }
    progress.update(100);
    progress.update(100);  // after the end: nothing more
  }
  std::rewind(out);
  std::string text;
  for (int c; (c = std::fgetc(out)) != EOF;) text += static_cast<char>(c);
  std::fclose(out);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text == "writing: 50% (50/100) after 5 s\nwriting: done, 100/100 in 9.9 s\n");
}

TEST_CASE("progress on a terminal is one bar redrawn in place at most ten times a second, ended by a newline") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  std::uint64_t now = 0;
  {
    Progress progress("writing", 4, Progress::Unit::items, out, /*terminal=*/1, [&] { return now; });
    progress.update(2);  // the first update draws
    now += 50'000'000;
    progress.update(3);  // 50 ms later: not redrawn
    now += 10'000'000;
    progress.update(4);  // the end always draws
  }
  std::rewind(out);
  std::string text;
  for (int c; (c = std::fgetc(out)) != EOF;) text += static_cast<char>(c);
  std::fclose(out);
  CHECK(text ==
        "\rwriting [####################....................] 2/4"
        "\rwriting [########################################] 4/4\n");
}

TEST_CASE("byte counts print in binary units") {
  CHECK(format_bytes(512) == "512 bytes");
  CHECK(format_bytes(1) == "1 byte");
  CHECK(format_bytes(512 * 1024) == "512 KiB");
  CHECK(format_bytes(std::uint64_t{1280} << 20) == "1.25 GiB");
  CHECK(format_bytes(std::uint64_t{960} << 20) == "960 MiB");
  CHECK(format_bytes(std::uint64_t{1536} << 10) == "1.50 MiB");
}

TEST_CASE("a count of one takes the singular: 1 tensor, 0 tensors, 2 launches") {
  CHECK(counted(1, "tensor") == "1 tensor");
  CHECK(counted(0, "tensor") == "0 tensors");
  CHECK(counted(24, "request") == "24 requests");
  CHECK(counted(1, "launch", "launches") == "1 launch");
  CHECK(counted(3, "launch", "launches") == "3 launches");
  ModelShape one_head{"custom", 1, 1, 128, "bf16", 2};
  CHECK(one_head.describe() == "1 layer, 1 KV head x head dim 128, bf16");
  ModelShape many{"custom", 80, 8, 128, "bf16", 2};
  CHECK(many.describe() == "80 layers, 8 KV heads x head dim 128, bf16");
}

TEST_CASE("the built-in model shapes hold the documented presets with their public shapes") {
  const ModelShapes& shapes = ModelShapes::built_in();
  struct Expected {
    const char* name;
    std::uint32_t layers, kv_heads, head_dim;
  };
  for (const Expected& e : {Expected{"llama-3-8b", 32, 8, 128}, Expected{"llama-3-70b", 80, 8, 128},
                            Expected{"qwen2.5-32b", 64, 8, 128}, Expected{"mistral-7b", 32, 8, 128}}) {
    CAPTURE(e.name);
    const ModelShape* shape = shapes.find(e.name);
    REQUIRE(shape != nullptr);
    CHECK(shape->layers == e.layers);
    CHECK(shape->kv_heads == e.kv_heads);
    CHECK(shape->head_dim == e.head_dim);
    CHECK(shape->dtype == "bf16");
    CHECK(shape->dtype_bytes == 2);
  }
  // The example's default shape: llama-3-70b, 256 tokens per block = the 512 KiB tensors of docs/kv-cache.md.
  CHECK(shapes.find("llama-3-70b")->tensor_bytes(256) == 512 * 1024);
  CHECK(shapes.find("no-such-model") == nullptr);
}

TEST_CASE("a model-shapes file with a missing field or an unknown dtype is refused, naming it") {
  auto missing = ModelShapes::parse(R"({"dtypes": {"bf16": {"bytes": 2}}, "models": {"m": {"layers": 2, "kv_heads": 8,
                                       "dtype": "bf16"}}})");
  REQUIRE_FALSE(missing);
  CHECK(missing.status().to_string().find("model 'm' needs \"head_dim\"") != std::string::npos);
  auto dtype = ModelShapes::parse(R"({"dtypes": {"bf16": {"bytes": 2}}, "models": {"m": {"layers": 2, "kv_heads": 8,
                                     "head_dim": 64, "dtype": "int3"}}})");
  REQUIRE_FALSE(dtype);
  CHECK(dtype.status().code() == tutti::StatusCode::INVALID_ARGUMENT);
  CHECK_FALSE(ModelShapes::parse("not json"));
}

TEST_CASE("fields of a model entry that the KV shape does not use are accepted and ignored") {
  // The model benchmark reads the same file and adds config.json's other fields (a float among them).
  auto parsed = ModelShapes::parse(R"({"description": ["x"], "dtypes": {"bf16": {"bytes": 2, "torch": "bfloat16"}},
      "models": {"llama-3-8b": {"hf_id": "meta-llama/Meta-Llama-3-8B", "layers": 32, "attention_heads": 32,
      "kv_heads": 8, "head_dim": 128, "hidden_size": 4096, "dtype": "bf16", "intermediate_size": 14336,
      "vocab_size": 128256, "rope_theta": 500000.0}}})");
  REQUIRE(parsed);
  const ModelShape* shape = parsed->find("llama-3-8b");
  REQUIRE(shape != nullptr);
  CHECK(shape->layers == 32);
  CHECK(shape->kv_heads == 8);
  CHECK(shape->head_dim == 128);
  CHECK(shape->tensor_bytes(256) == 256 * 8 * 128 * 2);
}

TEST_CASE("a folder on tmpfs is reported as RAM-backed, one on the build's disk is not") {
  struct statfs info {};
  if (::statfs("/dev/shm", &info) == 0 && info.f_type == TMPFS_MAGIC) {
    const FileSystemInfo shm = describe_filesystem("/dev/shm");
    CHECK(shm.type == "tmpfs");
    CHECK(shm.ram_backed == "tmpfs keeps its files in RAM");
  } else {
    MESSAGE("/dev/shm is not tmpfs here: the RAM-backed case is not checked");
  }
  const FileSystemInfo here = describe_filesystem(".");  // the build folder
  CHECK(here.type != "unknown");
  if (::statfs(".", &info) == 0 && info.f_type != TMPFS_MAGIC && info.f_type != RAMFS_MAGIC)
    CHECK(here.ram_backed.empty());
}

TEST_CASE("the example's data set is laid out as the KV block store lays out a store of its shape") {
  Shape shape;
  shape.layers = 3;
  shape.context_tokens = 1024;
  shape.chunk_tokens = 256;
  shape.tensor_bytes = 65536;
  tutti::kv::Namespace ns;
  ns.layers = 3;
  ns.piece_bytes = {65536, 65536};                                                // K and V of one block of one layer
  auto store = tutti::kv::Layout::compute(ns, std::uint64_t{4} * 3 * 2 * 65536);  // room for the 4 chunks
  REQUIRE(store);
  CHECK(store->slots == shape.chunks());
  CHECK(shape.layout().to_json() == store->to_json());
  CHECK(shape.layer_file_bytes() == store->file_bytes());
  for (std::uint32_t c = 0; c < shape.chunks(); ++c)
    for (std::uint32_t k = 0; k < 2; ++k) {
      CHECK(shape.tensor_offset(c, k) == store->offset(c, k));
      CHECK(shape.tensor_offset(c, k) == (std::uint64_t{c} * 2 + k) * 65536);  // as docs/kv-cache.md says
    }
  CHECK(shape.layer_file_name(2) == tutti::kv::Layout::file_name(2));
  CHECK(shape.layer_file_name(2) == "layer-00002.kv");
}

TEST_CASE("preparing a folder writes the shape's files and removes layer files it has no use for") {
  namespace fs = std::filesystem;
  const tutti::testing::TempDirectory scratch;  // removed with its files on every exit
  const fs::path dir(scratch.path);
  Shape shape;
  shape.layers = 2;
  shape.context_tokens = 1024;
  shape.chunk_tokens = 256;
  shape.tensor_bytes = 4096;
  std::ofstream(dir / "layer-000.kv") << "a format-2 file";  // the old naming
  std::ofstream(dir / "layer-00007.kv") << "a layer of another shape";
  std::ofstream(dir / "notes.txt") << "not ours";
  REQUIRE(prepare_files(shape, dir).is_ok());
  CHECK(data_set_complete(shape, dir));
  CHECK_FALSE(fs::exists(dir / "layer-000.kv"));
  CHECK_FALSE(fs::exists(dir / "layer-00007.kv"));
  CHECK(fs::exists(dir / "notes.txt"));
  CHECK(fs::file_size(dir / "layer-00001.kv") == shape.layer_file_bytes());
  // The content is the prepared tensors: chunk 3's V tensor of layer 1 hashes as expected.
  std::vector<std::byte> tensor(shape.tensor_bytes);
  std::ifstream in(dir / "layer-00001.kv", std::ios::binary);
  in.seekg(static_cast<std::streamoff>(shape.tensor_offset(3, 1)));
  in.read(reinterpret_cast<char*>(tensor.data()), static_cast<std::streamsize>(tensor.size()));
  CHECK(checksum(tensor) == expected_checksums(shape).at(1, 3, 1));
}

TEST_CASE("a striped data set puts every tensor on its shard at its shard offset, and pads shards with zeros") {
  // nvme-soft-striped's files without the images (main.cpp mounts one ext4 image per shard folder): 3
  // shards of 5 chunks x 2 tensors = 10 units per layer, so shards 0..2 hold 4, 3, 3 tensors and each
  // shard file is 4 units, the last one of shards 1 and 2 zeros. Reassembling the layer through
  // striped_file::place must give back every tensor of the unstriped layer file.
  namespace fs = std::filesystem;
  const tutti::testing::TempDirectory scratch;  // removed with its files on every exit
  const fs::path root(scratch.path);
  Shape shape;
  shape.layers = 2;
  shape.context_tokens = 1280;
  shape.chunk_tokens = 256;
  shape.tensor_bytes = 8192;
  shape.stripe_devices = 3;
  CHECK(shape.shard_file_bytes() == 4 * 8192);
  std::vector<fs::path> dirs;
  for (std::uint32_t i = 0; i < 3; ++i) {
    dirs.push_back(root / fmt::format("shard-{}", i));
    fs::create_directories(dirs.back());
    REQUIRE(prepare_files(shape, dirs.back(), i).is_ok());
    CHECK(data_set_complete(shape, dirs.back(), i));
    CHECK_FALSE(data_set_complete(shape, dirs.back(), (i + 1) % 3));  // the manifest names its shard
    CHECK(fs::file_size(dirs.back() / shape.layer_file_name(1)) == shape.shard_file_bytes());
  }
  CHECK(prepare_files(shape, dirs[0], 3).code() == tutti::StatusCode::INVALID_ARGUMENT);
  const Checksums sums = expected_checksums(shape);
  auto read_at = [&](const fs::path& path, std::uint64_t offset) {
    std::vector<std::byte> bytes(shape.tensor_bytes);
    std::ifstream in(path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(in.gcount() == static_cast<std::streamsize>(bytes.size()));
    return bytes;
  };
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    for (std::uint32_t c = 0; c < shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k) {
        const auto at = tutti::striped_file::place(shape.tensor_offset(c, k), shape.tensor_bytes, 3);
        CHECK(at.shard == (2 * c + k) % 3);
        CHECK(checksum(read_at(dirs[at.shard] / shape.layer_file_name(l), at.shard_offset)) == sums.at(l, c, k));
      }
    for (std::uint32_t shard : {1u, 2u}) {  // the padding unit past the layer's 10 tensors
      const auto pad = read_at(dirs[shard] / shape.layer_file_name(l), 3 * shape.tensor_bytes);
      CHECK(std::all_of(pad.begin(), pad.end(), [](std::byte b) { return b == std::byte{0}; }));
    }
  }
  // One device is the plain layer file: same size, same manifest as before striping existed.
  shape.stripe_devices = 1;
  CHECK(shape.shard_file_bytes() == shape.layer_file_bytes());
  CHECK_FALSE(shape_json(shape).contains("stripe"));
}
