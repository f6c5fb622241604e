// The Python objects over StorageRuntime: Runtime, Memory, Target, Request, Io, IoResult.
//
// One StorageRuntime type per backend name, behind AnyRuntime (virtual calls, one per Python call).
// Lifetimes: a Core owns the runtime and keeps every registered Python object (tensor, array) alive
// until its unregistration succeeded, so a tensor dropped by the caller while its IO is in flight is
// never freed under the IO. A Core whose runtime does not drain at destruction is leaked on purpose,
// with the objects it keeps (never freed under DMA).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <nanobind/ndarray.h>

#include <tutti/core/runtime.hpp>
#include <unordered_map>
#include <vector>

#include "ext.hpp"

namespace tutti::python {

/// One runtime of any backend; each member is one call of StorageRuntime (or of its DataPath).
class AnyRuntime {
 public:
  virtual ~AnyRuntime() = default;
  virtual std::string_view backend() const noexcept = 0;
  virtual const Capabilities& capabilities() const noexcept = 0;
  virtual Result<TargetHandle> open(std::string_view uri, const OpenOptions& options) = 0;
  virtual std::vector<Result<TargetHandle>> open_batch(std::span<const std::string> uris,
                                                       const OpenOptions& options) = 0;
  virtual Status close(TargetHandle target) = 0;
  virtual Result<std::uint64_t> target_size(TargetHandle target) = 0;
  virtual Result<MemoryHandle> register_memory(const MemoryView& view) = 0;
  virtual Status unregister_memory(MemoryHandle memory) = 0;
  virtual SubmitOutcome submit(std::span<const IoRequest> requests) = 0;
  virtual Result<IoProgress> query(IoHandle io) = 0;
  virtual Result<IoResult> wait(IoHandle io, std::uint64_t timeout_ns) = 0;
  virtual Status release(IoHandle io) = 0;
  virtual Status shutdown(std::uint64_t drain_timeout_ns) = 0;
  /// uring (CUDA profile): fences a DEVICE region on a caller's stream; others: UNSUPPORTED.
  virtual Status set_completion_stream(const void* address, void* stream) = 0;
  /// nvme-soft: the soft controller (fault injection, counters); nullptr otherwise.
  virtual void* soft_controller() noexcept { return nullptr; }
  /// The type-erased runtime object (for KvStore), and its backend's index in kRuntimeKinds.
  virtual void* native() noexcept = 0;
};

/// State shared by a Runtime and every object it made.
struct Core {
  std::unique_ptr<AnyRuntime> runtime;
  /// Python objects whose memory is registered, by Memory id; touched with the GIL held only.
  std::unordered_map<std::uint64_t, nb::object> owners;
  std::uint64_t next_id = 1;
  std::uint64_t default_drain_timeout_ns = RuntimeOptions::kDefaultDrainTimeoutNs;
  bool shut_down = false;
  ~Core();
};

struct PyRuntime {
  std::shared_ptr<Core> core;
};

struct PyMemory {
  std::shared_ptr<Core> core;
  MemoryHandle handle;
  MemoryView view;
  std::uint64_t id = 0;
  nb::object owner;  // the registered object (also held by core->owners while registered)
  bool registered = false;
};

struct PyTarget {
  std::shared_ptr<Core> core;
  TargetHandle handle;
  std::string uri;
  std::uint64_t size = 0;
  bool writable = false;
  bool open = false;
};

struct PyRequest {
  Direction direction = Direction::READ;
  nb::object memory;  // Memory or None (FLUSH)
  std::uint64_t memory_offset = 0;
  nb::object target;  // Target
  std::uint64_t target_offset = 0;
  std::uint64_t length = 0;
};

/// One request's outcome: rejected at submit (accepted = False) or completed.
struct PyRequestResult {
  std::size_t index = 0;
  bool accepted = false;
  StatusCode status = StatusCode::OK;
  std::string message;
  std::uint64_t bytes = 0;  // confirmed bytes
  std::uint32_t device_status = 0;
  std::uint32_t commands = 0;
};

struct PyIoResult {
  std::vector<PyRequestResult> requests;
  std::uint64_t requested_bytes = 0;
  std::uint64_t confirmed_bytes = 0;
  std::uint64_t commands = 0;
  std::vector<std::size_t> failed;  // rejected or failed, ascending
  std::optional<std::size_t> first_failure;
  bool ok() const noexcept { return failed.empty(); }
  Status first_status() const;
};

struct PyIo {
  std::shared_ptr<Core> core;
  IoHandle handle;
  std::vector<Status> initial_states;
  std::size_t accepted = 0;
  std::optional<PyIoResult> result;
  ~PyIo();
};

/// Whether an array's elements fill [data, data + nbytes) exactly once, in any dimension order
/// (C-contiguous, or a permuted view of a contiguous buffer such as vLLM's per-layer KV cache views):
/// then its bytes are one range and can be registered or read as one piece. Returns "" when dense,
/// else a description of the layout for the error message.
std::string dense_problem(const nb::ndarray<>& array);

/// Converts a Python sequence of Request objects or 6-tuples into IoRequests for `core`.
/// Raises TypeError / tutti.InvalidArgument naming the request index and field.
std::vector<IoRequest> to_requests(const std::shared_ptr<Core>& core, nb::handle requests);

}  // namespace tutti::python
