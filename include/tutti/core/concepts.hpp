// The compile-time contracts between the runtime, resolvers and DataPaths.
//
// A Resolver turns a URI into a typed target description, its payload (`target_type`).
// A DataPath executes IO on targets of exactly one payload type.
// A Backend<R, D> binds the two; it only exists when both name the same payload, so a mismatched
// pair is a compile error with a message in plain words (see tests/compile_fail/).
//
// Requirements are numbered; docs/extending.md walks through writing a new backend against them.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>

namespace tutti {

/// A payload: what a resolver produces and a DataPath opens. Requirements:
///  1. movable (it is handed from the resolver thread to the DataPath),
///  2. `size_bytes()` gives the target's size in bytes (the runtime checks bounds against it).
template <class P>
concept TargetPayload = std::movable<P> && requires(const P& p) {
  { p.size_bytes() } -> std::convertible_to<std::uint64_t>;
};

/// A Resolver. Requirements:
///  1. `R::target_type` is a TargetPayload,
///  2. `R::scheme` is the URI scheme it serves ("file", "memfs"),
///  3. `r.resolve(uri, options)` returns Result<target_type>; it must be safe to call from several
///     threads at once (open_batch resolves in parallel).
template <class R>
concept Resolver = requires(R& r, std::string_view uri, const OpenOptions& options) {
  typename R::target_type;
  requires TargetPayload<typename R::target_type>;
  { R::scheme } -> std::convertible_to<std::string_view>;
  { r.resolve(uri, options) } -> std::same_as<Result<typename R::target_type>>;
};

/// What the runtime hands a DataPath for one validated request: the registration and the open
/// target are the DataPath's own objects, owned by the runtime and pinned (not closed or
/// unregistered) until the request completes.
template <class D>
struct PathRequest {
  Direction direction;
  typename D::registered_memory* memory;  ///< Null for FLUSH.
  MemoryView memory_view;                 ///< The registered region (empty for FLUSH).
  std::uint64_t memory_offset;            ///< Bytes into memory_view.
  typename D::open_target* target;
  std::uint64_t target_offset;  ///< Bytes into the target.
  std::uint64_t length;         ///< Bytes; 0 for FLUSH.
};

/// How long one DataPath progress() call keeps waiting (requirement 6 of DataPath); the names follow
/// MPI_Waitall / MPI_Waitsome, which StorageRuntime::wait / wait_some mirror.
///  - ALL: until every accepted request of the batch completed, or the budget ran out.
///  - SOME: until at least one request completed that no earlier progress call on the batch
///    reported (already reported ones do not count), or every request completed, or the budget ran
///    out: StorageRuntime::wait_some hands completions out as they arrive without slicing its wait.
/// The return codes are the same in both: OK only when every accepted request completed.
enum class ProgressUntil : std::uint8_t { ALL, SOME };

/// A DataPath. Requirements:
///  1. types: `target_type` (the payload it opens), `open_target` (its state for one open target),
///     `registered_memory` (its state for one registration), `batch` (one submit's in-flight state);
///  2. `D::name` (for messages) and `static constexpr Capabilities capabilities`;
///  3. `open(payload&&, options)` -> Result<open_target>; `size_bytes(const open_target&)`;
///     `close(open_target&)` -> Status (only called with no IO in flight);
///  4. `register_memory(view)` -> Result<registered_memory>; `unregister_memory(registered_memory&)`
///     -> Status (only called with no IO in flight);
///  5. `submit(requests, states)` -> batch: never blocks; sets states[i] to OK (accepted) or to the
///     reason it rejected request i (RESOURCE_EXHAUSTED for backpressure); rejected requests never run;
///  6. `progress(batch&, completions, timeout_ns, until)` -> Status: fills completions[i] (same
///     indexing as the submitted span) of accepted requests as they complete, each once (an entry
///     stays as written); waits at most timeout_ns (0: look once, never block) and, with
///     until = ProgressUntil::SOME, returns as soon as it filled at least one entry no earlier call
///     filled; returns OK once all accepted requests completed, NOT_READY when they have not (the
///     budget ran out first, or SOME returned early), any other code when progress itself failed
///     (the requests then stay in flight and their memory registered). The DataPaths in this tree
///     default `until` to ProgressUntil::ALL for their own calls;
///  7. submit and progress on different batches may run concurrently from several threads.
template <class D>
concept DataPath = requires(D& d, typename D::target_type&& payload, const OpenOptions& options,
                            typename D::open_target& target, const typename D::open_target& ctarget,
                            typename D::registered_memory& memory, const MemoryView& view,
                            std::span<const PathRequest<D>> requests, std::span<Status> states,
                            typename D::batch& batch, std::span<RequestCompletion> completions,
                            std::uint64_t timeout_ns, ProgressUntil until) {
  requires TargetPayload<typename D::target_type>;
  requires std::movable<typename D::open_target>;
  requires std::movable<typename D::registered_memory>;
  requires std::movable<typename D::batch>;
  { D::name } -> std::convertible_to<std::string_view>;
  { D::capabilities } -> std::convertible_to<Capabilities>;
  { d.open(std::move(payload), options) } -> std::same_as<Result<typename D::open_target>>;
  { d.size_bytes(ctarget) } -> std::convertible_to<std::uint64_t>;
  { d.close(target) } -> std::same_as<Status>;
  { d.register_memory(view) } -> std::same_as<Result<typename D::registered_memory>>;
  { d.unregister_memory(memory) } -> std::same_as<Status>;
  { d.submit(requests, states) } -> std::same_as<typename D::batch>;
  { d.progress(batch, completions, timeout_ns, until) } -> std::same_as<Status>;
};

/// Binds a Resolver to a DataPath. Compiles only when both agree on the payload type; otherwise
/// a static_assert says which side is wrong in plain words.
template <class R, class D>
struct Backend {
  static_assert(Resolver<R>,
                "tutti::Backend<R, D>: R is not a Resolver. A Resolver needs a nested type `target_type` "
                "(with size_bytes()), a static `scheme`, and `resolve(std::string_view uri, const OpenOptions&)` "
                "returning Result<target_type>.");
  static_assert(DataPath<D>,
                "tutti::Backend<R, D>: D is not a DataPath. A DataPath needs `target_type`, `open_target`, "
                "`registered_memory`, `batch`, a static `name` and `capabilities`, and open/size_bytes/close/"
                "register_memory/unregister_memory/submit/progress as documented in tutti/core/concepts.hpp.");
  static_assert(std::is_same_v<typename R::target_type, typename D::target_type>,
                "tutti::Backend<R, D>: the Resolver's payload (R::target_type) is not the DataPath's payload "
                "(D::target_type), so this resolver cannot feed this DataPath. Pair a resolver and a DataPath "
                "that share one payload type (see include/tutti/bind/).");

  using resolver_type = R;
  using datapath_type = D;

  R resolver;
  D datapath;
};

}  // namespace tutti
