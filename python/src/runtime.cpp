// tutti.Runtime and its objects: one StorageRuntime call per Python call (runtime.hpp).
#include "runtime.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <functional>
#include <map>
#include <tutti/core/leak.hpp>
#include <tutti/presets.hpp>
#include <type_traits>
#if TUTTI_PYTHON_NVME_SOFT
#include <tutti/libnvm/soft_local_nvme.hpp>
#endif

namespace tutti::python {

namespace {

// ------------------------------------------------------------------------------------------------
// Backends: one StorageRuntime type each, behind AnyRuntime.

template <class R, class D>
class RuntimeModel final : public AnyRuntime {
 public:
  RuntimeModel(std::string_view name, std::shared_ptr<void> owner, R* runtime, void* soft = nullptr)
      : name_(name), owner_(std::move(owner)), runtime_(runtime), soft_(soft) {}
  ~RuntimeModel() override = default;

  std::string_view backend() const noexcept override { return name_; }
  const Capabilities& capabilities() const noexcept override { return D::capabilities; }
  Result<TargetHandle> open(std::string_view uri, const OpenOptions& options) override {
    return runtime_->open(uri, options);
  }
  std::vector<Result<TargetHandle>> open_batch(std::span<const std::string> uris, const OpenOptions& o) override {
    return runtime_->open_batch(uris, o);
  }
  Status close(TargetHandle target) override { return runtime_->close(target); }
  Result<std::uint64_t> target_size(TargetHandle target) override { return runtime_->target_size(target); }
  Result<MemoryHandle> register_memory(const MemoryView& view) override { return runtime_->register_memory(view); }
  Status unregister_memory(MemoryHandle memory) override { return runtime_->unregister_memory(memory); }
  SubmitOutcome submit(std::span<const IoRequest> requests) override { return runtime_->submit(requests); }
  Result<IoProgress> query(IoHandle io) override { return runtime_->query(io); }
  Result<IoResult> wait(IoHandle io, std::uint64_t timeout_ns) override { return runtime_->wait(io, timeout_ns); }
  Status release(IoHandle io) override { return runtime_->release(io); }
  Status shutdown(std::uint64_t drain_timeout_ns) override { return runtime_->shutdown(drain_timeout_ns); }
  Status set_completion_stream(const void* address, void* stream) override {
    if constexpr (std::is_same_v<D, uring::UringDataPath>) {
      return runtime_->datapath().set_completion_stream(address, accel::StreamRef::from_native_handle(stream));
    } else {
      (void)address;
      (void)stream;
      return error(StatusCode::UNSUPPORTED,
                   "stream: the {} backend does not fence on a caller's stream (the uring backend of the CUDA build "
                   "does)",
                   name_);
    }
  }
  void* soft_controller() noexcept override { return soft_; }
  void* native() noexcept override { return runtime_; }

 private:
  std::string_view name_;
  std::shared_ptr<void> owner_;  // owns *runtime_ (and the soft controller stack for nvme-soft)
  R* runtime_;
  void* soft_;
};

/// Reads **options into C++ settings: each key has a setter; unknown keys and wrong types are
/// INVALID_ARGUMENT naming the key.
class OptionReader {
 public:
  explicit OptionReader(std::string context) : context_(std::move(context)) {}
  template <class T>
  OptionReader& add(const char* name, T& field) {
    setters_[name] = [this, name, &field](nb::handle value) {
      if constexpr (std::is_same_v<T, bool>) {
        if (!PyBool_Check(value.ptr())) fail(name, value, "a bool");
        field = value.ptr() == Py_True;
      } else if constexpr (std::is_same_v<T, std::string>) {
        if (!nb::isinstance<nb::str>(value)) fail(name, value, "a str");
        field = nb::cast<std::string>(value);
      } else {
        if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) fail(name, value, "an int");
        long long v = PyLong_AsLongLong(value.ptr());
        if (PyErr_Occurred() || v < 0 || static_cast<unsigned long long>(v) > std::numeric_limits<T>::max()) {
          PyErr_Clear();
          fail(name, value, fmt::format("an int in 0..{}", std::numeric_limits<T>::max()));
        }
        field = static_cast<T>(v);
      }
    };
    return *this;
  }
  OptionReader& add_seconds(const char* name, std::uint64_t& field_ns) {
    setters_[name] = [this, name, &field_ns](nb::handle value) {
      if (!PyFloat_Check(value.ptr()) && !(PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())))
        fail(name, value, "a number of seconds");
      field_ns = seconds_to_ns(nb::cast<double>(value), fmt::format("{}: {}", context_, name));
    };
    return *this;
  }
  void read(const nb::kwargs& kwargs) {
    for (auto [key, value] : kwargs) {
      const std::string name = nb::cast<std::string>(key);
      auto it = setters_.find(name);
      if (it == setters_.end()) {
        std::string known;
        for (const auto& [k, _] : setters_) known += (known.empty() ? "" : ", ") + k;
        raise_status(
            error(StatusCode::INVALID_ARGUMENT, "{}: unknown option '{}'; accepted: {}", context_, name, known));
      }
      it->second(value);
    }
  }

 private:
  [[noreturn]] void fail(const char* name, nb::handle value, std::string_view expected) {
    raise_status(error(StatusCode::INVALID_ARGUMENT, "{}: option {} = {} must be {}", context_, name,
                       nb::cast<std::string>(nb::repr(value)), expected));
  }
  std::string context_;
  std::map<std::string, std::function<void(nb::handle)>> setters_;
};

void add_runtime_options(OptionReader& reader, RuntimeOptions& runtime) {
  reader.add("open_batch_threads", runtime.open_batch_threads)
      .add_seconds("destructor_drain_timeout_s", runtime.destructor_drain_timeout_ns);
}

std::unique_ptr<AnyRuntime> make_runtime(const std::string& backend, const nb::kwargs& kwargs,
                                         std::uint64_t& drain_ns) {
  RuntimeOptions runtime_options;
  const std::string context = fmt::format("Runtime('{}')", backend);
  if (backend == "uring") {
    uring::Options o;
    OptionReader reader(context);
    reader.add("queue_depth", o.queue_depth)
        .add("sqpoll", o.sqpoll)
        .add("registered_files", o.registered_files)
        .add("fixed_buffers", o.fixed_buffers)
        .add("max_command_bytes", o.max_command_bytes)
        .add("staging_buffers", o.staging_buffers)
        .add("staging_buffer_bytes", o.staging_buffer_bytes)
        .add_seconds("close_flush_timeout_s", o.close_flush_timeout_ns);
    add_runtime_options(reader, runtime_options);
    reader.read(kwargs);
    drain_ns = runtime_options.destructor_drain_timeout_ns;
    Result<UringRuntime> created = [&] {
      nb::gil_scoped_release release;
      return make_uring_runtime(o, runtime_options);
    }();
    auto owned = std::make_shared<UringRuntime>(check(std::move(created)));
    UringRuntime* raw = owned.get();
    return std::make_unique<RuntimeModel<UringRuntime, uring::UringDataPath>>("uring", std::move(owned), raw);
  }
  if (backend == "memfs") {
    memfs::MemfsDataPath::Options o;
    memfs::Store::Options store;
    OptionReader reader(context);
    reader.add("queue_depth", o.queue_depth)
        .add("max_file_bytes", store.max_file_bytes)
        .add("max_total_bytes", store.max_total_bytes);
    add_runtime_options(reader, runtime_options);
    reader.read(kwargs);
    drain_ns = runtime_options.destructor_drain_timeout_ns;
    auto owned = std::make_shared<MemfsRuntime>(
        check(make_memfs_runtime(o, runtime_options, memfs::MemfsResolver(std::make_shared<memfs::Store>(store)))));
    MemfsRuntime* raw = owned.get();
    return std::make_unique<RuntimeModel<MemfsRuntime, memfs::MemfsDataPath>>("memfs", std::move(owned), raw);
  }
  if (backend == "nvme-soft") {
#if TUTTI_PYTHON_NVME_SOFT
    // CUDA build: make_soft_local_nvme creates the soft controller in accelerator_mode and GPU threads
    // run local_nvme's submit and poll kernels, whose launches libtutti_cuda compiles once (its objects
    // are linked into this extension), so this host-compiled file launches them too; CUDA tensors
    // register as DEVICE memory that the controller reaches with map_device.
    SoftLocalNvmeOptions o;
    OptionReader reader(context);
    std::uint64_t partition_start = 0;
    reader.add("backing_path", o.backing_path)
        .add("block_device_path", o.block_device_path)
        .add("partition_start_bytes", partition_start)
        .add("lba_size", o.soft.lba_size)
        .add("worker_threads", o.soft.worker_threads)
        .add("queue_pairs", o.datapath.queue_pairs)
        .add("queue_depth", o.datapath.queue_depth)
        .add_seconds("command_timeout_s", o.datapath.command_timeout_ns);
    add_runtime_options(reader, o.runtime);
    reader.read(kwargs);
    o.partition_start_bytes = partition_start;
    if (o.backing_path.empty() || o.block_device_path.empty())
      raise_status(error(StatusCode::INVALID_ARGUMENT,
                         "{}: backing_path = '{}' and block_device_path = '{}' are required (the ext4 image and the "
                         "loop device it is mounted from; tutti.scratch.ScratchExt4 makes both)",
                         context, o.backing_path, o.block_device_path));
    drain_ns = o.runtime.destructor_drain_timeout_ns;
    Result<std::unique_ptr<SoftLocalNvme>> created = [&] {
      nb::gil_scoped_release release;
      return make_soft_local_nvme(o);
    }();
    std::shared_ptr<SoftLocalNvme> stack = check(std::move(created));
    LocalNvmeRuntime* raw = stack->runtime.get();
    void* soft = stack->device.get();
    return std::make_unique<RuntimeModel<LocalNvmeRuntime, local_nvme::LocalNvmeDataPath>>("nvme-soft",
                                                                                           std::move(stack), raw, soft);
#else
    raise_status(error(StatusCode::UNSUPPORTED, "Runtime('nvme-soft'): this build has no libnvm"));
#endif
  }
  raise_status(
      error(StatusCode::INVALID_ARGUMENT, "Runtime: backend = '{}' is not 'uring', 'nvme-soft' or 'memfs'", backend));
}

// ------------------------------------------------------------------------------------------------
// Python objects

AnyRuntime& live(const std::shared_ptr<Core>& core) {
  if (!core || !core->runtime) raise_status(error(StatusCode::NOT_FOUND, "the runtime was destroyed"));
  return *core->runtime;
}

/// The MemoryView of a Python object (DLPack or buffer protocol), without a copy.
MemoryView view_of(nb::handle obj, nb::ndarray<>& array, std::uint64_t alignment, std::string_view backend) {
  if (!nb::try_cast(obj, array, /*convert=*/false))
    raise_status(error(StatusCode::INVALID_ARGUMENT,
                       "register: an object of type {} is not a writable array with DLPack (__dlpack__) or the buffer "
                       "protocol (torch.Tensor, numpy.ndarray, bytearray ...)",
                       nb::cast<std::string>(nb::str(obj.type().attr("__qualname__")))));
  if (array.size() == 0)
    raise_status(error(StatusCode::INVALID_ARGUMENT, "register: the array has 0 elements; a region needs >= 1 byte"));
  if (const std::string problem = dense_problem(array); !problem.empty())
    raise_status(error(StatusCode::INVALID_ARGUMENT,
                       "register: {}: its bytes are not one range; register the tensor it is a view of, or a "
                       "contiguous copy (tensor.contiguous())",
                       problem));
  MemoryView view;
  view.address = array.data();
  view.size = array.nbytes();
  switch (array.device_type()) {
    case nb::device::cpu::value: view.kind = MemoryKind::HOST; break;
    case nb::device::cuda_host::value: view.kind = MemoryKind::PINNED_HOST; break;
    case nb::device::cuda::value:
      view.kind = MemoryKind::DEVICE;
      view.accelerator_id = array.device_id();
      break;
    default:
      raise_status(error(StatusCode::UNSUPPORTED,
                         "register: DLPack device type {} is not CPU (1), CUDA (2) or CUDA host (3) memory",
                         array.device_type()));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(view.address);
  if (alignment > 1 && address % alignment != 0)
    raise_status(error(StatusCode::INVALID_ARGUMENT,
                       "register: the array's data at {:#x} is not a multiple of {} bytes, the {} backend's memory "
                       "alignment (torch and numpy align CPU memory to 64 bytes only): allocate it with "
                       "tutti.empty(shape, dtype, device), or copy it into one",
                       address, alignment, backend));
  return view;
}

void* stream_pointer(nb::handle stream) {
  // torch.cuda.Stream and cupy streams carry the cudaStream_t as an int attribute.
  for (const char* attr : {"cuda_stream", "ptr"})
    if (nb::hasattr(stream, attr)) return reinterpret_cast<void*>(nb::cast<std::uintptr_t>(stream.attr(attr)));
  if (PyLong_Check(stream.ptr())) return reinterpret_cast<void*>(nb::cast<std::uintptr_t>(stream));
  raise_status(error(StatusCode::INVALID_ARGUMENT,
                     "stream: {} is not a CUDA stream (torch.cuda.Stream, an object with .cuda_stream, or an int "
                     "cudaStream_t)",
                     nb::cast<std::string>(nb::repr(stream))));
}

PyMemory* make_memory(const std::shared_ptr<Core>& core, nb::handle obj, nb::handle stream) {
  AnyRuntime& rt = live(core);
  nb::ndarray<> array;
  const MemoryView view = view_of(obj, array, rt.capabilities().memory_alignment, rt.backend());
  Result<MemoryHandle> registered = [&] {
    nb::gil_scoped_release release;
    return rt.register_memory(view);
  }();
  const MemoryHandle handle = check(std::move(registered));
  if (!stream.is_none()) {
    Status fenced = rt.set_completion_stream(view.address, stream_pointer(stream));
    if (!fenced.is_ok()) {
      nb::gil_scoped_release release;
      (void)rt.unregister_memory(handle);  // nothing used it yet
    }
    check(fenced);
  }
  auto memory = new PyMemory{core, handle, view, core->next_id++, nb::borrow(obj), true};
  core->owners.emplace(memory->id, nb::borrow(obj));
  return memory;
}

void unregister(PyMemory& memory) {
  if (!memory.registered)
    raise_status(error(StatusCode::NOT_FOUND, "unregister: {} was already unregistered", memory.handle.to_string()));
  AnyRuntime& rt = live(memory.core);
  Status s;
  {
    nb::gil_scoped_release release;
    s = rt.unregister_memory(memory.handle);
  }
  if (s.code() == StatusCode::BUSY) raise_status(s);  // still in use: stays registered and alive
  memory.registered = false;
  memory.core->owners.erase(memory.id);
  check(s);
}

OpenOptions open_options(bool writable, bool flush_on_close, bool allow_buffered) {
  OpenOptions o;
  o.writable = writable;
  o.flush_on_close = flush_on_close;
  o.allow_buffered = allow_buffered;
  return o;
}

PyTarget* make_target(const std::shared_ptr<Core>& core, TargetHandle handle, std::string uri, bool writable) {
  auto size = core->runtime->target_size(handle);
  return new PyTarget{core, handle, std::move(uri), size ? *size : 0, writable, true};
}

PyIoResult make_result(const std::vector<Status>& initial, const IoResult* completed) {
  PyIoResult out;
  out.requests.resize(initial.size());
  for (std::size_t i = 0; i < initial.size(); ++i) {
    PyRequestResult& r = out.requests[i];
    r.index = i;
    r.accepted = initial[i].is_ok();
    if (!r.accepted) {
      r.status = initial[i].code();
      r.message = initial[i].message();
    }
  }
  if (completed != nullptr) {
    out.requested_bytes = completed->requested_bytes;
    out.confirmed_bytes = completed->confirmed_bytes;
    out.commands = completed->commands;
    for (const RequestCompletion& c : completed->completions) {
      if (c.request_index >= out.requests.size()) continue;
      PyRequestResult& r = out.requests[c.request_index];
      r.status = c.status.code();
      r.message = c.status.message();
      r.bytes = c.confirmed_bytes;
      r.device_status = c.device_status;
      r.commands = c.commands;
    }
  }
  for (const PyRequestResult& r : out.requests)
    if (r.status != StatusCode::OK) out.failed.push_back(r.index);
  if (!out.failed.empty()) out.first_failure = out.failed.front();
  return out;
}

nb::object result_error(const PyIoResult& result) {
  nb::object exc = exception_for(result.first_status());
  nb::setattr(exc, "result", nb::cast(result));
  return exc;
}

const PyIoResult& wait_io(PyIo& io, double timeout_s, bool raise_on_failure) {
  if (!io.result) {
    const std::uint64_t budget = seconds_to_ns(timeout_s, "Io.wait: timeout_s");
    if (io.handle.is_null()) {
      io.result = make_result(io.initial_states, nullptr);  // nothing was accepted: nothing to wait for
    } else {
      AnyRuntime& rt = live(io.core);
      Result<IoResult> last = error(StatusCode::TIMEOUT, "{} not complete after {} ns", io.handle.to_string(), budget);
      const bool finished = wait_in_slices(budget, [&](std::uint64_t slice) {
        last = rt.wait(io.handle, slice);
        return last.is_ok() || last.code() != StatusCode::TIMEOUT;
      });
      if (!finished)
        raise_status(error(StatusCode::TIMEOUT,
                           "Io.wait: {} not complete after timeout_s = {} s; it stays in flight, "
                           "wait again",
                           io.handle.to_string(), timeout_s));
      if (!last.is_ok()) raise_status(last.status());  // a DataPath progress error: the IO stays in flight
      io.result = make_result(io.initial_states, &last.value());
      if (rt.release(io.handle).is_ok()) io.handle = IoHandle{};
    }
  }
  if (raise_on_failure && !io.result->ok()) {
    nb::object exc = result_error(*io.result);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    throw nb::python_error();
  }
  return *io.result;
}

PyIo* submit(const std::shared_ptr<Core>& core, nb::handle requests) {
  AnyRuntime& rt = live(core);
  std::vector<IoRequest> converted = to_requests(core, requests);
  SubmitOutcome outcome;
  {
    nb::gil_scoped_release release;
    outcome = rt.submit(converted);
  }
  return new PyIo{core, outcome.io, std::move(outcome.initial_states), outcome.accepted, std::nullopt};
}

/// The benchmark's C++ baseline: `iterations` x (submit + wait + release) of the same requests in a
/// C++ loop, GIL released. Returns the mean ns per iteration. Every iteration must succeed whole.
double bench_submit_wait(const std::shared_ptr<Core>& core, nb::handle requests, std::uint64_t iterations,
                         double timeout_s) {
  AnyRuntime& rt = live(core);
  std::vector<IoRequest> converted = to_requests(core, requests);
  const std::uint64_t budget = seconds_to_ns(timeout_s, "timeout_s");
  Status failure;
  std::uint64_t elapsed = 0;
  {
    nb::gil_scoped_release release;
    const std::uint64_t start = monotonic_ns();
    for (std::uint64_t i = 0; i < iterations && failure.is_ok(); ++i) {
      SubmitOutcome outcome = rt.submit(converted);
      if (outcome.accepted != converted.size()) {
        for (const Status& s : outcome.initial_states)
          if (!s.is_ok() && failure.is_ok()) failure = s;
      }
      if (outcome.io.is_null()) break;
      Result<IoResult> result = rt.wait(outcome.io, budget);
      if (!result)
        failure = result.status();
      else if (!result->status.is_ok() && failure.is_ok())
        failure = result->status;
      if (Status released = rt.release(outcome.io); !released.is_ok() && failure.is_ok()) failure = released;
    }
    elapsed = monotonic_ns() - start;
  }
  check(failure);
  return iterations ? static_cast<double>(elapsed) / static_cast<double>(iterations) : 0.0;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

std::string dense_problem(const nb::ndarray<>& array) {
  std::vector<std::pair<std::int64_t, std::size_t>> dims;  // (stride, extent) of dimensions of extent > 1
  for (std::size_t i = 0; i < array.ndim(); ++i)
    if (array.shape(i) != 1) dims.emplace_back(array.stride(i), array.shape(i));
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  bool dense = true;
  for (const auto& [stride, extent] : dims) {
    if (stride != expected) dense = false;
    expected *= static_cast<std::int64_t>(extent);
  }
  if (dense) return {};
  std::string shape, strides;
  for (std::size_t k = 0; k < array.ndim(); ++k) {
    shape += fmt::format("{}{}", k ? ", " : "", array.shape(k));
    strides += fmt::format("{}{}", k ? ", " : "", array.stride(k));
  }
  return fmt::format("the array (shape ({}), strides ({}) in elements) has gaps or overlaps", shape, strides);
}

Core::~Core() {
  if (!runtime) return;
  if (!shut_down) {
    Status s;
    {
      nb::gil_scoped_release release;
      s = runtime->shutdown(default_drain_timeout_ns);
    }
    if (!s.is_ok()) {
      // IO still in flight after the drain: the runtime and every object whose memory it may still
      // write stay alive forever (never freed under DMA).
      leak_on_purpose(runtime.release());
      for (auto& [id, owner] : owners) (void)owner.release();
      return;
    }
  }
  {
    nb::gil_scoped_release release;
    runtime.reset();
  }
  owners.clear();
}

Status PyIoResult::first_status() const {
  if (!first_failure) return Status::success();
  const PyRequestResult& r = requests[*first_failure];
  if (!r.accepted) return Status(r.status, fmt::format("{} (rejected at submit: it never ran)", r.message));
  return Status(r.status, fmt::format("requests[{}]: {}", r.index, r.message));
}

PyIo::~PyIo() {
  // A completed IO whose result was never waited for: free its handle (a poll, never a wait). One
  // still in flight stays in the runtime's table; shutdown drains it.
  if (!handle.is_null() && core && core->runtime) {
    nb::gil_scoped_release release;
    (void)core->runtime->release(handle);
  }
}

std::vector<IoRequest> to_requests(const std::shared_ptr<Core>& core, nb::handle requests) {
  if (!PySequence_Check(requests.ptr()) || nb::isinstance<nb::str>(requests))
    raise_status(error(StatusCode::INVALID_ARGUMENT, "requests must be a list of tutti.Request or 6-tuples"));
  const Py_ssize_t n = PySequence_Size(requests.ptr());
  std::vector<IoRequest> out(static_cast<std::size_t>(n));
  auto memory_of = [&](nb::handle m, Py_ssize_t i, Direction d) -> MemoryHandle {
    if (m.is_none()) return MemoryHandle{};
    PyMemory* memory = nullptr;
    if (!nb::try_cast(m, memory) || memory == nullptr)
      raise_status(error(StatusCode::INVALID_ARGUMENT,
                         "requests[{}].memory is a {}, not a tutti.Memory (from "
                         "Runtime.register){}",
                         i, nb::cast<std::string>(nb::str(m.type().attr("__qualname__"))),
                         d == Direction::FLUSH ? " or None" : ""));
    if (memory->core != core)
      raise_status(error(StatusCode::INVALID_ARGUMENT, "requests[{}].memory was registered with another Runtime", i));
    return memory->handle;
  };
  auto target_of = [&](nb::handle t, Py_ssize_t i) -> TargetHandle {
    PyTarget* target = nullptr;
    if (!nb::try_cast(t, target) || target == nullptr)
      raise_status(error(StatusCode::INVALID_ARGUMENT,
                         "requests[{}].target is a {}, not a tutti.Target (from "
                         "Runtime.open)",
                         i, nb::cast<std::string>(nb::str(t.type().attr("__qualname__")))));
    if (target->core != core)
      raise_status(error(StatusCode::INVALID_ARGUMENT, "requests[{}].target was opened by another Runtime", i));
    return target->handle;
  };
  auto u64 = [&](nb::handle v, Py_ssize_t i, const char* field) -> std::uint64_t {
    if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
      raise_status(error(StatusCode::INVALID_ARGUMENT, "requests[{}].{} = {} is not an int (bytes)", i, field,
                         nb::cast<std::string>(nb::repr(v))));
    const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      raise_status(error(StatusCode::INVALID_ARGUMENT, "requests[{}].{} = {} is not in 0..2^64-1 bytes", i, field,
                         nb::cast<std::string>(nb::repr(v))));
    }
    return x;
  };
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::object item = nb::steal(PySequence_GetItem(requests.ptr(), i));
    if (!item.is_valid()) throw nb::python_error();
    IoRequest& r = out[static_cast<std::size_t>(i)];
    PyRequest* request = nullptr;
    if (!PyTuple_Check(item.ptr()) && nb::try_cast(item, request) && request != nullptr) {
      r.direction = request->direction;
      r.memory = memory_of(request->memory, i, r.direction);
      r.memory_offset = request->memory_offset;
      r.target = target_of(request->target, i);
      r.target_offset = request->target_offset;
      r.length = request->length;
      continue;
    }
    if (!PyTuple_Check(item.ptr()) || PyTuple_Size(item.ptr()) != 6)
      raise_status(error(StatusCode::INVALID_ARGUMENT,
                         "requests[{}] is {}; expected a tutti.Request or a tuple (direction, memory, memory_offset, "
                         "target, target_offset, length)",
                         i, nb::cast<std::string>(nb::repr(item))));
    nb::tuple t = nb::borrow<nb::tuple>(item);
    if (!nb::try_cast(t[0], r.direction))
      raise_status(error(StatusCode::INVALID_ARGUMENT, "requests[{}].direction = {} is not a tutti.Direction", i,
                         nb::cast<std::string>(nb::repr(t[0]))));
    r.memory = memory_of(t[1], i, r.direction);
    r.memory_offset = u64(t[2], i, "memory_offset");
    r.target = target_of(t[3], i);
    r.target_offset = u64(t[4], i, "target_offset");
    r.length = u64(t[5], i, "length");
  }
  return out;
}

void define_runtime(nb::module_& m) {
  nb::class_<PyMemory>(m, "Memory",
                       "A registered region: the tensor or array given to Runtime.register, kept alive while "
                       "registered.\n\nThread-safety: any thread.")
      .def_prop_ro(
          "address", [](const PyMemory& self) { return reinterpret_cast<std::uintptr_t>(self.view.address); },
          "Address of the first byte (int).")
      .def_prop_ro(
          "size", [](const PyMemory& self) { return self.view.size; }, "Size in bytes.")
      .def_prop_ro(
          "kind", [](const PyMemory& self) { return self.view.kind; }, "HOST, PINNED_HOST or DEVICE.")
      .def_prop_ro(
          "device", [](const PyMemory& self) { return self.view.accelerator_id; },
          "CUDA device ordinal of DEVICE memory; -1 for host memory.")
      .def_prop_ro(
          "obj", [](const PyMemory& self) { return self.owner; }, "The registered object.")
      .def_prop_ro("registered", [](const PyMemory& self) { return self.registered; })
      .def("unregister", &unregister,
           "Unregisters the region (one StorageRuntime.unregister_memory).\n\n"
           "Raises tutti.Busy while IO that uses it is in flight (it stays registered; wait for the IO and call "
           "again), tutti.NotFound when already unregistered.")
      .def("__repr__", [](const PyMemory& self) {
        return fmt::format("<tutti.Memory {} {} bytes at {:#x}{}>", to_string(self.view.kind), self.view.size,
                           reinterpret_cast<std::uintptr_t>(self.view.address),
                           self.registered ? "" : " (unregistered)");
      });

  nb::class_<PyTarget>(m, "Target", "An open target (a file, or a memfs file). Thread-safety: any thread.")
      .def_prop_ro("uri", [](const PyTarget& self) { return self.uri; })
      .def_prop_ro(
          "size", [](const PyTarget& self) { return self.size; }, "Size in bytes at open.")
      .def_prop_ro("writable", [](const PyTarget& self) { return self.writable; })
      .def_prop_ro("is_open", [](const PyTarget& self) { return self.open; })
      .def(
          "close",
          [](PyTarget& self) {
            if (!self.open) raise_status(error(StatusCode::NOT_FOUND, "close: '{}' was already closed", self.uri));
            AnyRuntime& rt = live(self.core);
            Status s;
            {
              nb::gil_scoped_release release;
              s = rt.close(self.handle);
            }
            if (s.code() != StatusCode::BUSY && s.code() != StatusCode::TIMEOUT) self.open = false;
            check(s);
          },
          "Closes the target (flushing first when opened with flush_on_close).\n\n"
          "Raises tutti.Busy while IO on it is in flight, tutti.TimeoutError when its flush did not finish in "
          "time (it stays open: call close again), tutti.NotFound when already closed.")
      .def("__repr__", [](const PyTarget& self) {
        return fmt::format("<tutti.Target '{}' {} bytes{}>", self.uri, self.size, self.open ? "" : " (closed)");
      });

  nb::class_<PyRequest>(m, "Request",
                        "One IO request: `length` bytes between memory[memory_offset:] and target[target_offset:].\n\n"
                        "A tuple (direction, memory, memory_offset, target, target_offset, length) is accepted "
                        "wherever a Request is. FLUSH takes memory=None and zero offsets and length.")
      .def(
          "__init__",
          [](PyRequest* self, Direction direction, nb::object memory, std::uint64_t memory_offset, nb::object target,
             std::uint64_t target_offset, std::uint64_t length) {
            new (self) PyRequest{direction, std::move(memory), memory_offset, std::move(target), target_offset, length};
          },
          nb::arg("direction"), nb::arg("memory").none(), nb::arg("memory_offset"), nb::arg("target"),
          nb::arg("target_offset"), nb::arg("length"),
          nb::sig("def __init__(self, direction: Direction, memory: Memory | None, memory_offset: int, target: Target, "
                  "target_offset: int, length: int) -> None"))
      .def_rw("direction", &PyRequest::direction)
      .def_prop_rw(
          "memory", [](const PyRequest& self) { return self.memory; },
          [](PyRequest& self, nb::object m) { self.memory = std::move(m); },
          nb::for_getter(nb::sig("def memory(self, /) -> Memory | None")),
          nb::for_setter(nb::sig("def memory(self, value: Memory | None, /) -> None")),
          "tutti.Memory, or None for FLUSH.")
      .def_rw("memory_offset", &PyRequest::memory_offset, "Bytes from the start of the registered region.")
      .def_prop_rw(
          "target", [](const PyRequest& self) { return self.target; },
          [](PyRequest& self, nb::object t) { self.target = std::move(t); },
          nb::for_getter(nb::sig("def target(self, /) -> Target")),
          nb::for_setter(nb::sig("def target(self, value: Target, /) -> None")), "tutti.Target.")
      .def_rw("target_offset", &PyRequest::target_offset, "Bytes from the start of the target.")
      .def_rw("length", &PyRequest::length, "Bytes to move (0 for FLUSH).")
      .def("__repr__", [](const PyRequest& self) {
        return fmt::format("tutti.Request({}, memory_offset={}, target_offset={}, length={})",
                           to_string(self.direction), self.memory_offset, self.target_offset, self.length);
      });

  nb::class_<PyRequestResult>(m, "RequestResult", "The outcome of one request of an Io.")
      .def_ro("index", &PyRequestResult::index, "Index in the submitted list.")
      .def_ro("accepted", &PyRequestResult::accepted, "False when submit rejected it (it never ran).")
      .def_ro("status", &PyRequestResult::status, "StatusCode.OK, or why it was rejected or failed.")
      .def_ro("message", &PyRequestResult::message, "The C++ message ('' when OK).")
      .def_ro("bytes", &PyRequestResult::bytes, "Bytes confirmed moved (never more than requested).")
      .def_ro("device_status", &PyRequestResult::device_status, "Raw NVMe status (SCT << 8 | SC); 0 if none.")
      .def_ro("commands", &PyRequestResult::commands, "Device commands it was split into.")
      .def_prop_ro("ok", [](const PyRequestResult& self) { return self.status == StatusCode::OK; })
      .def("__repr__", [](const PyRequestResult& self) {
        return fmt::format("<tutti.RequestResult [{}] {} {} bytes{}{}>", self.index, to_string(self.status), self.bytes,
                           self.message.empty() ? "" : ": ", self.message);
      });

  nb::class_<PyIoResult>(m, "IoResult", "The result of a completed Io: one RequestResult per submitted request.")
      .def_ro("requests", &PyIoResult::requests, "RequestResult per request, in submit order.")
      .def_ro("requested_bytes", &PyIoResult::requested_bytes, "Sum of the accepted requests' lengths.")
      .def_ro("confirmed_bytes", &PyIoResult::confirmed_bytes, "Sum of bytes confirmed moved.")
      .def_ro("commands", &PyIoResult::commands, "Device commands issued for the whole IO.")
      .def_ro("failed", &PyIoResult::failed, "Indices of requests rejected at submit or failed, ascending.")
      .def_prop_ro("ok", &PyIoResult::ok, "True when every request was accepted and succeeded.")
      .def("__len__", [](const PyIoResult& self) { return self.requests.size(); })
      .def("__getitem__",
           [](const PyIoResult& self, std::size_t i) {
             if (i >= self.requests.size()) throw nb::index_error();
             return self.requests[i];
           })
      .def("__repr__", [](const PyIoResult& self) {
        return fmt::format("<tutti.IoResult {} requests, {} of {} bytes, {} failed>", self.requests.size(),
                           self.confirmed_bytes, self.requested_bytes, self.failed.size());
      });

  nb::class_<PyIo>(m, "Io",
                   "A submitted batch. Requests rejected at submit never ran and are reported, never retried "
                   "(partial commit).\n\nThread-safety: one thread waits at a time.")
      .def_ro("accepted", &PyIo::accepted, "Number of requests submit accepted.")
      .def_prop_ro(
          "rejected",
          [](const PyIo& self) {
            std::vector<PyRequestResult> out;
            for (std::size_t i = 0; i < self.initial_states.size(); ++i)
              if (!self.initial_states[i].is_ok())
                out.push_back({i, false, self.initial_states[i].code(), self.initial_states[i].message(), 0, 0, 0});
            return out;
          },
          "RequestResult of each request submit rejected (it never ran): validation errors, or "
          "RESOURCE_EXHAUSTED backpressure (resubmit it).")
      .def("__len__", [](const PyIo& self) { return self.initial_states.size(); })
      .def(
          "done",
          [](PyIo& self) {
            if (self.result || self.handle.is_null()) return true;
            AnyRuntime& rt = live(self.core);
            Result<IoProgress> progress = [&] {
              nb::gil_scoped_release release;
              return rt.query(self.handle);
            }();
            if (progress.code() == StatusCode::BUSY) return false;  // another thread is inside wait()
            return check(std::move(progress)).complete;
          },
          "True once every accepted request completed (a non-blocking StorageRuntime.query).\n\n"
          "Raises the DataPath's progress error.")
      .def(
          "wait",
          [](PyIo& self, double timeout_s, bool check_result) -> const PyIoResult& {
            return wait_io(self, timeout_s, check_result);
          },
          nb::arg("timeout_s"), nb::arg("check") = true, nb::rv_policy::reference_internal,
          "Waits at most timeout_s seconds for the IO (GIL released; Ctrl-C interrupts within 50 ms and leaves the "
          "IO in flight, wait again) and returns its IoResult; later calls return the same result.\n\n"
          "Raises tutti.TimeoutError when not complete in time (the IO stays in flight: wait again), the DataPath's "
          "progress error, and with check=True (the default) the tutti.Error of the first rejected or failed "
          "request, whose `.result` is the IoResult (nothing is hidden: the other requests' bytes are there).")
      .def("__repr__", [](const PyIo& self) {
        return fmt::format("<tutti.Io {} requests, {} accepted{}>", self.initial_states.size(), self.accepted,
                           self.result ? ", done" : "");
      });

  nb::class_<PyRuntime>(
      m, "Runtime",
      "A Tutti StorageRuntime over one backend.\n\n"
      "Runtime(backend, **options): backend 'uring' (files on any file system, io_uring + O_DIRECT), "
      "'nvme-soft' (files on an ext4 image, NVMe commands on the soft controller's queues; needs backing_path "
      "and block_device_path) or 'memfs' (host memory). Options per backend are listed in docs/python.md; an "
      "unknown option raises tutti.InvalidArgument.\n\n"
      "As a context manager it shuts down on exit with a bounded drain (destructor_drain_timeout_s, 5 s by "
      "default).\n\nThread-safety: every method may be called from any thread.")
      .def(
          "__init__",
          [](PyRuntime* self, const std::string& backend, nb::kwargs options) {
            auto core = std::make_shared<Core>();
            core->runtime = make_runtime(backend, options, core->default_drain_timeout_ns);
            new (self) PyRuntime{std::move(core)};
          },
          nb::arg("backend"), nb::arg("options"))
      .def_prop_ro("backend", [](const PyRuntime& self) { return std::string(live(self.core).backend()); })
      .def_prop_ro(
          "alignment", [](const PyRuntime& self) { return live(self.core).capabilities().memory_alignment; },
          "Bytes: address + memory_offset of every request must be a multiple (4096 for uring).")
      .def_prop_ro(
          "offset_alignment", [](const PyRuntime& self) { return live(self.core).capabilities().offset_alignment; },
          "Bytes: target_offset and length must be multiples (except a tail ending at the target's end).")
      .def_prop_ro("max_request_bytes",
                   [](const PyRuntime& self) { return live(self.core).capabilities().max_request_bytes; })
      .def_prop_ro("max_batch_requests",
                   [](const PyRuntime& self) { return live(self.core).capabilities().max_batch_requests; })
      .def(
          "open",
          [](PyRuntime& self, const std::string& uri, bool writable, bool flush_on_close, bool allow_buffered) {
            AnyRuntime& rt = live(self.core);
            Result<TargetHandle> opened = [&] {
              nb::gil_scoped_release release;
              return rt.open(uri, open_options(writable, flush_on_close, allow_buffered));
            }();
            return make_target(self.core, check(std::move(opened)), uri, writable);
          },
          nb::arg("uri"), nb::arg("writable") = false, nb::arg("flush_on_close") = false,
          nb::arg("allow_buffered") = false, nb::rv_policy::take_ownership,
          "Opens file:///path (uring, nvme-soft) or memfs://name?size=BYTES (memfs) and returns a Target.\n\n"
          "Raises tutti.InvalidArgument (malformed URI, unknown scheme), tutti.NotFound (no such file), "
          "tutti.Unsupported (no O_DIRECT, no FIEMAP), tutti.DataLoss (unwritten extents, nvme-soft), tutti.Busy "
          "after shutdown.")
      .def(
          "open_batch",
          [](PyRuntime& self, std::vector<std::string> uris, bool writable, bool check_all) {
            AnyRuntime& rt = live(self.core);
            std::vector<Result<TargetHandle>> opened;
            {
              nb::gil_scoped_release release;
              opened = rt.open_batch(uris, open_options(writable, false, false));
            }
            nb::list out;
            std::optional<std::size_t> first;
            for (std::size_t i = 0; i < opened.size(); ++i) {
              if (opened[i]) {
                out.append(
                    nb::cast(make_target(self.core, *opened[i], uris[i], writable), nb::rv_policy::take_ownership));
              } else {
                if (!first) first = i;
                out.append(exception_for(opened[i].status()));
              }
            }
            if (check_all && first) {
              nb::object exc = exception_for(opened[*first].status().with_context(fmt::format("uris[{}]", *first)));
              nb::setattr(exc, "results", out);
              PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
              throw nb::python_error();
            }
            return out;
          },
          nb::arg("uris"), nb::arg("writable") = false, nb::arg("check") = true,
          nb::sig(
              "def open_batch(self, uris: collections.abc.Sequence[str], writable: bool = False, check: bool = True) "
              "-> list[Target | Error]"),
          "Opens many URIs, resolving them on open_batch_threads threads; returns one Target per URI, in order.\n\n"
          "With check=True (default) raises the first failure's tutti.Error, whose `.results` lists a Target or "
          "an exception per URI (targets that opened stay open there); with check=False returns that list.")
      .def(
          "register",
          [](PyRuntime& self, nb::handle obj, nb::handle stream) { return make_memory(self.core, obj, stream); },
          nb::arg("obj"), nb::arg("stream") = nb::none(), nb::rv_policy::take_ownership,
          "Registers a tensor or array without a copy (DLPack, or the buffer protocol) and returns a Memory.\n\n"
          "torch CPU tensors and numpy arrays are HOST memory, CUDA tensors DEVICE memory (CUDA build). The data "
          "must be dense (C-contiguous, or a permuted view of a contiguous buffer: one byte range), writable and "
          "start on a multiple of Runtime.alignment bytes (4096 for uring: "
          "allocate with tutti.empty). The object is kept alive until unregister succeeds. `stream` (CUDA build, "
          "uring, DEVICE memory): fence this region's staged copies on a CUDA stream (torch.cuda.Stream), see "
          "docs/python.md.\n\n"
          "Raises tutti.InvalidArgument (not an array, gaps between elements, misaligned, read-only), "
          "tutti.Unsupported "
          "(a memory kind no backend of this build takes), tutti.Busy after shutdown.")
      .def(
          "unregister", [](PyRuntime&, PyMemory& memory) { unregister(memory); }, nb::arg("memory"),
          "Same as memory.unregister().")
      .def(
          "submit", [](PyRuntime& self, nb::handle requests) { return submit(self.core, requests); },
          nb::arg("requests"), nb::rv_policy::take_ownership,
          nb::sig("def submit(self, requests: collections.abc.Sequence[Request | tuple[Direction, Memory | None, int, "
                  "Target, int, int]]) -> Io"),
          "Submits a list of requests (tutti.Request or 6-tuples) in one StorageRuntime.submit and returns an Io; "
          "never blocks.\n\nEach request is validated on its own: a rejected one (bad offset, misaligned, "
          "RESOURCE_EXHAUSTED backpressure ...) is in Io.rejected and in the IoResult, the others run. Raises "
          "tutti.InvalidArgument only for a malformed list (nothing submitted).")
      .def(
          "shutdown",
          [](PyRuntime& self, double drain_timeout_s) {
            AnyRuntime& rt = live(self.core);
            const std::uint64_t budget = seconds_to_ns(drain_timeout_s, "shutdown: drain_timeout_s");
            Status s;
            {
              nb::gil_scoped_release release;
              s = rt.shutdown(budget);
            }
            check(s);
            self.core->shut_down = true;
            self.core->owners.clear();
          },
          nb::arg("drain_timeout_s") = 5.0,
          "Refuses new work, waits at most drain_timeout_s for in-flight IO, then closes every target and "
          "unregisters every region (their objects are released).\n\n"
          "Raises tutti.TimeoutError when IO did not drain (nothing is freed; call again), tutti.Busy when a "
          "device still holds memory.")
      .def("__enter__", [](nb::handle self) { return self; })
      .def(
          "__exit__",
          [](PyRuntime& self, nb::handle, nb::handle, nb::handle) {
            if (self.core->shut_down) return false;
            AnyRuntime& rt = live(self.core);
            Status s;
            {
              nb::gil_scoped_release release;
              s = rt.shutdown(self.core->default_drain_timeout_ns);
            }
            check(s);
            self.core->shut_down = true;
            self.core->owners.clear();
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc").none(), nb::arg("traceback").none())
      .def(
          "inject_fault",
          [](PyRuntime& self, const std::string& action, double delay_s, std::uint64_t nth_command,
             std::uint64_t max_fires) {
#if TUTTI_PYTHON_NVME_SOFT
            auto* soft = static_cast<libnvm::SoftController*>(live(self.core).soft_controller());
            if (soft == nullptr)
              raise_status(error(StatusCode::UNSUPPORTED, "inject_fault: only the nvme-soft backend injects faults"));
            libnvm::SoftFaultRule rule;
            if (action == "delay_completion")
              rule.action = libnvm::SoftFaultRule::Action::delay_completion;
            else if (action == "complete_with_status")
              rule.action = libnvm::SoftFaultRule::Action::complete_with_status;
            else
              raise_status(error(StatusCode::INVALID_ARGUMENT,
                                 "inject_fault: action = '{}' is not 'delay_completion' or 'complete_with_status'",
                                 action));
            rule.delay_ns = seconds_to_ns(delay_s, "inject_fault: delay_s");
            rule.nth_command = nth_command;
            rule.max_fires = max_fires;
            return soft->inject_fault(rule);
#else
            (void)self, (void)action, (void)delay_s, (void)nth_command, (void)max_fires;
            raise_status(error(StatusCode::UNSUPPORTED, "inject_fault: this build has no libnvm"));
#endif
          },
          nb::arg("action"), nb::arg("delay_s") = 0.0, nb::arg("nth_command") = 0, nb::arg("max_fires") = 1,
          "nvme-soft only, for tests: injects a fault into the soft controller's next I/O commands.\n\n"
          "action 'delay_completion' executes a command delay_s seconds late; 'complete_with_status' fails it with "
          "Unrecovered Read Error (the IO then fails tutti.DeviceError). nth_command: fire on the nth matching "
          "command (0: every one); max_fires: at most this many times (0: unlimited). Returns the rule id.\n\n"
          "Raises tutti.Unsupported on other backends.")
      .def(
          "_bench_submit_wait",
          [](PyRuntime& self, nb::handle requests, std::uint64_t iterations, double timeout_s) {
            return bench_submit_wait(self.core, requests, iterations, timeout_s);
          },
          nb::arg("requests"), nb::arg("iterations"), nb::arg("timeout_s") = 10.0,
          nb::sig("def _bench_submit_wait(self, requests: collections.abc.Sequence[Request | tuple[Direction, "
                  "Memory | None, int, Target, int, int]], iterations: int, timeout_s: float = 10.0) -> float"),
          "Benchmark baseline: iterations x (submit + wait + release) of the same requests in a C++ loop; returns "
          "the mean ns per iteration. Raises the first failure.")
      .def("__repr__", [](const PyRuntime& self) {
        return fmt::format("<tutti.Runtime '{}'{}>", self.core->runtime ? self.core->runtime->backend() : "destroyed",
                           self.core->shut_down ? " (shut down)" : "");
      });
}

}  // namespace tutti::python
