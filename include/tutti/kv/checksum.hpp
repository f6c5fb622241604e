// Block checksums: XXH3-64 (seed 0) of each piece of a block, computed where the bytes are.
//
//   host_checksum(p, n)      HOST / PINNED_HOST memory: libxxhash's XXH3_64bits on the calling thread.
//   DeviceHasher::hash(...)  DEVICE memory: two kernels through accel::launch (a GPU in the CUDA
//                            profile, the host thread pool in the host profile, where "device
//                            memory" is host memory), bit-exact with XXH3_64bits (kv/xxh3.hpp).
//
// DeviceHasher's kernels: the first runs 8 logical threads per input longer than 240 bytes, each
// computing one of XXH3's 8 accumulators over the whole input (kv/xxh3.hpp explains why they are
// independent); the second runs one thread per input and either merges the 8 accumulators or hashes
// a short input whole. Inputs, accumulators and results live in one device buffer that also holds
// the secret; it grows to the largest batch seen and is reused.
//
// CUDA profile: the two launches are compiled once, in libtutti_cuda (src/cuda/kv_launch.cu), so
// hash() runs the kernels on the GPU from host-compiled and nvcc-compiled callers alike (one
// definition per program: accel/launch.hpp).
// Thread-safety: host_checksum is pure; one DeviceHasher serialises its hash() calls with a mutex.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/core/status.hpp>
#include <tutti/kv/xxh3.hpp>

namespace tutti::kv {

/// XXH3-64 (seed 0) of host memory, with libxxhash.
inline std::uint64_t host_checksum(const void* address, std::uint64_t length) noexcept {
  return XXH3_64bits(address, static_cast<std::size_t>(length));
}

/// One input of a device checksum batch: `length` bytes at `address` (device memory).
struct HashInput {
  const void* address = nullptr;
  std::uint64_t length = 0;
};

namespace detail {

/// Kernel 1: thread (input i, lane j) computes accumulator j of input i when the input is large.
struct Xxh3LaneKernel {
  const HashInput* inputs;
  std::uint64_t* accumulators;  // kLanes per input
  const std::uint8_t* secret;
  std::uint32_t count;
  TUTTI_HOST_DEVICE void operator()(accel::ThreadIndex index) const {
    const std::uint32_t t = index.global();
    const std::uint32_t input = t / xxh3::kLanes, lane = t % xxh3::kLanes;
    if (input >= count) return;
    const HashInput in = inputs[input];
    if (in.length <= xxh3::kMidSizeMax) return;
    accumulators[t] = xxh3::large_lane(static_cast<const std::uint8_t*>(in.address), in.length, secret, lane);
  }
};

/// Kernel 2: thread i merges input i's accumulators, or hashes a short input whole.
struct Xxh3FinishKernel {
  const HashInput* inputs;
  const std::uint64_t* accumulators;
  std::uint64_t* results;
  const std::uint8_t* secret;
  std::uint32_t count;
  TUTTI_HOST_DEVICE void operator()(accel::ThreadIndex index) const {
    const std::uint32_t i = index.global();
    if (i >= count) return;
    const HashInput in = inputs[i];
    results[i] = in.length <= xxh3::kMidSizeMax
                     ? xxh3::hash_small(static_cast<const std::uint8_t*>(in.address), in.length, secret)
                     : xxh3::large_merge(accumulators + std::size_t{i} * xxh3::kLanes, in.length, secret);
  }
};

}  // namespace detail

inline namespace TUTTI_PROFILE_NAMESPACE {
/// cuda profile: one launch of a checksum kernel on config.stream (asynchronous; errors as
/// accel::launch). Defined once, in libtutti_cuda (src/cuda/kv_launch.cu); the host profile never
/// calls them (it launches on the host thread pool, accel::launch).
Status launch_kernel(const accel::LaunchConfig& config, const detail::Xxh3LaneKernel& kernel);
Status launch_kernel(const accel::LaunchConfig& config, const detail::Xxh3FinishKernel& kernel);
}  // namespace TUTTI_PROFILE_NAMESPACE

namespace detail {
/// The launch of a checksum kernel for this profile (accel::kProfile: libtutti_cuda's, or the host
/// thread pool's).
template <class Kernel>
Status launch_checksum_kernel(const accel::LaunchConfig& config, const Kernel& kernel) {
  if constexpr (accel::kProfile == accel::Profile::cuda) {
    return launch_kernel(config, kernel);
  } else {
    return accel::launch(config, kernel);
  }
}
}  // namespace detail

/// Hashes batches of device-memory inputs with the XXH3 kernels. Create once, reuse.
class DeviceHasher {
 public:
  /// Threads per block of both launches.
  static constexpr std::uint32_t kThreadsPerBlock = 128;
  /// Most inputs per hash() call (one launch's grid stays far below every limit).
  static constexpr std::size_t kMaxInputs = std::size_t{1} << 22;

  /// `stream`: where the kernels are enqueued (CUDA: a cudaStream_t, nullptr = the default
  /// stream; host: ignored).
  explicit DeviceHasher(void* stream = nullptr) : stream_(stream) {}
  ~DeviceHasher() {
    if (buffer_) accel::free_device(buffer_);
  }
  DeviceHasher(const DeviceHasher&) = delete;
  DeviceHasher& operator=(const DeviceHasher&) = delete;

  /// Writes XXH3-64 of each input into out[i] (same order). Waits for the kernels at most
  /// timeout_ns. Errors: INVALID_ARGUMENT (out.size() != inputs.size(), more than kMaxInputs, a
  /// null address with a non-zero length), RESOURCE_EXHAUSTED / DEVICE_ERROR (allocation, copy or launch), TIMEOUT (the
  /// kernels did not finish: out is unchanged, and the hasher refuses further work because they may still read its
  /// buffer).
  Status hash(std::span<const HashInput> inputs, std::span<std::uint64_t> out, std::uint64_t timeout_ns) {
    if (out.size() != inputs.size())
      return error(StatusCode::INVALID_ARGUMENT, "checksum: out.size() = {} must equal inputs.size() = {}", out.size(),
                   inputs.size());
    if (inputs.size() > kMaxInputs)
      return error(StatusCode::INVALID_ARGUMENT, "checksum: inputs.size() = {} exceeds the limit of {}", inputs.size(),
                   kMaxInputs);
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].address == nullptr && inputs[i].length != 0)
        return error(StatusCode::INVALID_ARGUMENT, "checksum: inputs[{}].address is null for length = {}", i,
                     inputs[i].length);
    if (inputs.empty()) return Status::success();
    std::scoped_lock lock(mutex_);
    if (!usable_.is_ok()) return usable_;
    TUTTI_RETURN_IF_ERROR(reserve(inputs.size()));
    const auto count = static_cast<std::uint32_t>(inputs.size());
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(inputs_, inputs.data(), inputs.size_bytes()).with_context("checksum"));
    const std::uint64_t lane_threads = std::uint64_t{count} * xxh3::kLanes;
    accel::LaunchConfig lanes{static_cast<std::uint32_t>((lane_threads + kThreadsPerBlock - 1) / kThreadsPerBlock),
                              kThreadsPerBlock, stream_};
    TUTTI_RETURN_IF_ERROR(
        detail::launch_checksum_kernel(lanes, detail::Xxh3LaneKernel{inputs_, accumulators_, secret_, count})
            .with_context("checksum kernel"));
    accel::LaunchConfig finish{(count + kThreadsPerBlock - 1) / kThreadsPerBlock, kThreadsPerBlock, stream_};
    TUTTI_RETURN_IF_ERROR(detail::launch_checksum_kernel(
                              finish, detail::Xxh3FinishKernel{inputs_, accumulators_, results_, secret_, count})
                              .with_context("checksum kernel"));
    if (Status s = accel::synchronize(stream_, timeout_ns); !s.is_ok()) {
      if (s.code() == StatusCode::TIMEOUT) usable_ = s.with_context("checksum (the hasher is unusable from now on)");
      return s.with_context("checksum");
    }
    return accel::copy_from_device(out.data(), results_, out.size_bytes()).with_context("checksum");
  }

 private:
  Status reserve(std::size_t count) {
    if (count <= capacity_) return Status::success();
    const std::size_t want = std::max<std::size_t>(count, 256);
    const std::size_t bytes = 256 + want * (sizeof(HashInput) + (xxh3::kLanes + 1) * sizeof(std::uint64_t));
    auto allocated = accel::allocate_device(bytes);
    if (!allocated) return allocated.status().with_context("checksum buffer");
    if (Status s = accel::copy_to_device(*allocated, xxh3::kDefaultSecret.bytes, xxh3::kSecretBytes); !s.is_ok()) {
      accel::free_device(*allocated);
      return s.with_context("checksum secret");
    }
    if (buffer_) accel::free_device(buffer_);
    buffer_ = *allocated;
    auto* base = static_cast<std::uint8_t*>(buffer_);
    secret_ = base;
    inputs_ = reinterpret_cast<HashInput*>(base + 256);
    accumulators_ = reinterpret_cast<std::uint64_t*>(base + 256 + want * sizeof(HashInput));
    results_ = accumulators_ + want * xxh3::kLanes;
    capacity_ = want;
    return Status::success();
  }

  void* stream_ = nullptr;
  std::mutex mutex_;
  Status usable_;
  void* buffer_ = nullptr;
  std::size_t capacity_ = 0;
  const std::uint8_t* secret_ = nullptr;
  HashInput* inputs_ = nullptr;
  std::uint64_t* accumulators_ = nullptr;
  std::uint64_t* results_ = nullptr;
};

}  // namespace tutti::kv
