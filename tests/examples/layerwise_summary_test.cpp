// The layer-wise example's summary logic (examples/layerwise_kv_overlap/pipeline.hpp): the verdict of
// what bounded the pipeline, shared by the host and CUDA builds, and the per-source tensor counts.
#include <doctest/doctest.h>

#include "../../examples/layerwise_kv_overlap/pipeline.hpp"

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
        "restore alone 6.25 ms, compute 2.50 ms, pipeline 22.50 ms: write-bound: compute waited 20.00 ms for IO (89% of "
        "the pipeline); the pipeline's thread waited 0.50 ms for reads, 19.50 ms for writes");
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
  CHECK(layer_bound_line(f).find("(0% of the pipeline") != std::string::npos);
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
