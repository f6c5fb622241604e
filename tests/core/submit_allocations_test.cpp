// submit() on its success path formats no message and allocates nothing per request: the runtime's
// own heap allocations per submit are the outcome's vector and the IO entry (the shared entry and the
// one arena that holds its per-request arrays), whatever the number of requests. Failures still get
// their messages. (docs/api.md, "Cost of submit".)
//
// Allocations are counted with a replaced global operator new, on this thread only, while the
// runtime's code runs: a wrapper DataPath pauses the count while the memfs DataPath works (its own
// batch is the DataPath's business, not the runtime's).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <span>
#include <vector>

#include <require_ok.hpp>
#include <tutti/tutti.hpp>

namespace {

thread_local bool counting = false;
thread_local std::uint64_t allocations = 0;

void* counted_allocation(std::size_t bytes, std::size_t alignment) {
  if (counting) ++allocations;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(bytes ? bytes : 1)
                : std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

/// Pauses the count for the DataPath's own work.
struct NotCounted {
  NotCounted() : was(counting) { counting = false; }
  ~NotCounted() { counting = was; }
  bool was;
};

}  // namespace

void* operator new(std::size_t bytes) { return counted_allocation(bytes, alignof(std::max_align_t)); }
void* operator new[](std::size_t bytes) { return counted_allocation(bytes, alignof(std::max_align_t)); }
void* operator new(std::size_t bytes, std::align_val_t a) {
  return counted_allocation(bytes, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t bytes, std::align_val_t a) {
  return counted_allocation(bytes, static_cast<std::size_t>(a));
}
// The nothrow forms too (memfs allocates its files with new (std::nothrow) T[]): every allocation then comes
// from malloc and goes back to free, which AddressSanitizer's alloc-dealloc check requires.
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(bytes, alignof(std::max_align_t));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(bytes, alignof(std::max_align_t));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using namespace tutti;

/// The memfs DataPath with the allocation count paused while it submits and progresses (its batch is
/// its own business); everything else is inherited.
class UncountedMemfs : public memfs::MemfsDataPath {
 public:
  using inner_type = memfs::MemfsDataPath;
  UncountedMemfs() : inner_type(testing::require_ok(inner_type::create({}))) {}

  batch submit(std::span<const PathRequest<UncountedMemfs>> requests, std::span<Status> states) {
    NotCounted pause;
    std::vector<PathRequest<inner_type>> forwarded;
    forwarded.reserve(requests.size());
    for (const auto& r : requests)
      forwarded.push_back({r.direction, r.memory, r.memory_view, r.memory_offset, r.target, r.target_offset, r.length});
    return inner_type::submit(forwarded, states);
  }
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL) {
    NotCounted pause;
    return inner_type::progress(b, completions, timeout_ns, until);
  }
};
static_assert(DataPath<UncountedMemfs>);

using Runtime = StorageRuntime<Backend<memfs::MemfsResolver, UncountedMemfs>>;

struct Rig {
  Rig() {
    target = testing::require_ok(runtime.open("memfs://allocations?size=1048576", {.writable = true}));
    memory = testing::require_ok(runtime.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST}));
  }
  /// The runtime's allocations in one submit of `requests`; the IO is waited for and released.
  std::uint64_t allocations_of_submit(const std::vector<IoRequest>& requests, SubmitOutcome& outcome) {
    allocations = 0;
    counting = true;
    outcome = runtime.submit(requests);
    counting = false;
    const std::uint64_t counted = allocations;
    if (outcome.accepted > 0) {
      REQUIRE(runtime.wait(outcome.io, 1'000'000'000).is_ok());
      REQUIRE(runtime.release(outcome.io).is_ok());
    }
    return counted;
  }
  std::vector<IoRequest> reads(std::size_t n) const {
    std::vector<IoRequest> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back({Direction::READ, memory, 0, target, (i % 256) * 4096, 4096});
    return out;
  }
  Runtime runtime{Backend<memfs::MemfsResolver, UncountedMemfs>{}};
  std::vector<std::byte> buffer = std::vector<std::byte>(4096);
  TargetHandle target;
  MemoryHandle memory;
};

}  // namespace

TEST_CASE("submit allocates nothing per request on success: the outcome's vector and the IO entry only") {
  Rig rig;
  SubmitOutcome outcome;
  (void)rig.allocations_of_submit(rig.reads(64), outcome);  // warm up: the IO handle table grows once
  for (std::size_t n : {std::size_t{1}, std::size_t{8}, std::size_t{64}, std::size_t{1024}}) {
    CAPTURE(n);
    const std::uint64_t counted = rig.allocations_of_submit(rig.reads(n), outcome);
    REQUIRE(outcome.accepted == n);
    // 1: outcome.initial_states; 2: the IO entry (one shared object); 3: its arena of per-request arrays.
    CHECK(counted == 3);
  }
}

TEST_CASE("a request that fails validation still gets a message naming the field, and the rest run") {
  Rig rig;
  std::vector<IoRequest> requests = rig.reads(4);
  requests[2].target = TargetHandle{};
  requests[3].memory_offset = 1;  // the region is 4096 bytes: the transfer reaches past it
  SubmitOutcome outcome;
  (void)rig.allocations_of_submit(requests, outcome);
  CHECK(outcome.accepted == 2);
  CHECK(outcome.initial_states[2].code() == StatusCode::INVALID_ARGUMENT);
  CHECK(outcome.initial_states[2].message() == "requests[2].target is a null target handle");
  CHECK(outcome.initial_states[3].code() == StatusCode::OUT_OF_RANGE);
  CHECK(outcome.initial_states[3].message().find("requests[3]: memory_offset = 1") != std::string::npos);
}
