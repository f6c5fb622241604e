// Helpers of the uring suites: page-aligned buffers, deterministic file contents (the file IO, file
// sizes and scratch directories come from tests/support/real_files.hpp), plain (buffered) reads of
// what the file system holds, and a runtime loop that waits for a submit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <real_files.hpp>
#include <require_ok.hpp>
#include <tutti/presets/uring.hpp>

namespace tutti::testing {

inline constexpr std::uint64_t kSecond = 1'000'000'000;

/// A zeroed buffer of `size` bytes aligned to 4096 bytes (size rounded up to 4096).
struct AlignedBuffer {
  explicit AlignedBuffer(std::uint64_t size)
      : bytes((size + 4095) / 4096 * 4096),
        data(static_cast<std::byte*>(std::aligned_alloc(4096, static_cast<std::size_t>(bytes))), std::free) {
    std::memset(data.get(), 0, static_cast<std::size_t>(bytes));
  }
  std::byte* get() const { return data.get(); }
  MemoryView view() const { return {data.get(), bytes, MemoryKind::HOST, -1}; }
  std::uint64_t bytes;
  std::unique_ptr<std::byte, void (*)(void*)> data;
};

/// The deterministic byte at `offset` of a test file with `seed`.
inline std::byte pattern_byte(std::uint64_t offset, std::uint32_t seed) {
  std::uint64_t x = offset * 0x9E3779B97F4A7C15ull + seed * 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}

/// Writes `size` pattern bytes to `path` (created or replaced) through the file system, then fsyncs.
inline void write_pattern_file(const std::string& path, std::uint64_t size, std::uint32_t seed) {
  write_file(path, FileWrite::REPLACE, size, [seed](std::uint64_t at, std::span<std::byte> chunk) {
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = pattern_byte(at + i, seed);
  });
}

/// What the file system returns for [offset, offset + length) through a plain (buffered) pread.
inline std::vector<std::byte> read_plain(const std::string& path, std::uint64_t offset, std::uint64_t length) {
  return read_file<std::byte>(path, offset, length);
}

/// Whether `memory[0, length)` equals the pattern of the file region starting at `offset`.
inline bool matches_pattern(const std::byte* memory, std::uint64_t offset, std::uint64_t length, std::uint32_t seed) {
  for (std::uint64_t i = 0; i < length; ++i)
    if (memory[i] != pattern_byte(offset + i, seed)) return false;
  return true;
}

/// Submits every request, resubmitting those rejected with RESOURCE_EXHAUSTED after waiting for the
/// accepted ones, until all ran. Returns the per-request completion statuses in input order.
inline std::vector<RequestCompletion> run_all(UringRuntime& runtime, const std::vector<IoRequest>& requests) {
  std::vector<RequestCompletion> out(requests.size());
  std::vector<std::size_t> todo(requests.size());
  for (std::size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  for (int round = 0; !todo.empty(); ++round) {
    REQUIRE(round < 100000);
    std::vector<IoRequest> batch;
    for (std::size_t i : todo) batch.push_back(requests[i]);
    auto outcome = runtime.submit(batch);
    std::vector<std::size_t> again;
    for (std::size_t k = 0; k < batch.size(); ++k) {
      if (outcome.initial_states[k].is_ok()) continue;
      REQUIRE_MESSAGE(outcome.initial_states[k].code() == StatusCode::RESOURCE_EXHAUSTED,
                      outcome.initial_states[k].to_string());
      again.push_back(todo[k]);
    }
    if (outcome.accepted > 0) {
      auto result = runtime.wait(outcome.io, 30 * kSecond);
      REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
      for (const auto& c : result->completions) out[todo[c.request_index]] = c;
      REQUIRE(runtime.release(outcome.io).is_ok());
    }
    todo = std::move(again);
  }
  return out;
}

}  // namespace tutti::testing
