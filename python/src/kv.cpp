// tutti.KvStore: the KV block store (include/tutti/kv/, docs/kv-store.md) over a tutti.Runtime.
// One KvStore call per Python call, except load_layers / store_layers, which call load / store once
// per layer (the layer-wise pattern: submit every layer, then wait_layer(i) as compute reaches i).
//
// Pieces come from tensors without a copy: either one registered tensor and a block index per key
// (the block is tensor[block], split into the namespace's pieces in order), or a list of tensors
// (one per key and piece), each a view that lies inside a region registered with this store.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <tutti/kv/kv.hpp>
#include <tutti/presets.hpp>

#include "runtime.hpp"
// nvme-soft stores: wherever libnvm is in the package (both builds; runtime.cpp).
#if TUTTI_PYTHON_NVME_SOFT
#define TUTTI_PYTHON_KV_NVME_SOFT 1
#include <tutti/libnvm/soft_local_nvme.hpp>
#else
#define TUTTI_PYTHON_KV_NVME_SOFT 0
#endif

namespace tutti::python {

namespace {

using Keys = nb::typed<nb::sequence, nb::bytes>;  // the engine's block hashes, 1..64 bytes each

/// One KvStore of any runtime type; each member is one KvStore call.
class AnyKvStore {
 public:
  virtual ~AnyKvStore() = default;
  virtual Result<MemoryHandle> register_memory(const MemoryView& view) = 0;
  virtual Status unregister_memory(MemoryHandle handle) = 0;
  virtual Result<std::size_t> lookup(std::span<const std::string_view> keys) = 0;
  virtual Result<kv::KvIo> load(std::span<const std::string_view> keys, std::uint32_t layer,
                                std::span<const kv::Piece> pieces) = 0;
  virtual Result<kv::KvIo> store(std::span<const std::string_view> keys, std::uint32_t layer,
                                 std::span<const kv::Piece> pieces) = 0;
  virtual Result<kv::LayerResult> wait(kv::KvIo io, std::uint64_t timeout_ns) = 0;
  virtual Result<std::vector<kv::LayerResult>> wait_layer(std::uint32_t layer, std::uint64_t timeout_ns) = 0;
  virtual Result<std::vector<Status>> commit(std::span<const std::string_view> keys, std::uint64_t timeout_ns) = 0;
  virtual Status discard(std::span<const std::string_view> keys) = 0;
  virtual Status pin(std::span<const std::string_view> keys) = 0;
  virtual Status unpin(std::span<const std::string_view> keys) = 0;
  virtual Result<std::size_t> evict(std::span<const std::string_view> keys) = 0;
  virtual kv::Statistics statistics() const = 0;
  virtual const kv::Namespace& name_space() const noexcept = 0;
  virtual bool read_only() const noexcept = 0;
};

template <class R>
class KvModel final : public AnyKvStore {
 public:
  explicit KvModel(std::unique_ptr<kv::KvStore<R>> store) : store_(std::move(store)) {}
  Result<MemoryHandle> register_memory(const MemoryView& view) override { return store_->register_memory(view); }
  Status unregister_memory(MemoryHandle handle) override { return store_->unregister_memory(handle); }
  Result<std::size_t> lookup(std::span<const std::string_view> keys) override { return store_->lookup(keys); }
  Result<kv::KvIo> load(std::span<const std::string_view> keys, std::uint32_t layer,
                        std::span<const kv::Piece> pieces) override {
    return store_->load(keys, layer, pieces);
  }
  Result<kv::KvIo> store(std::span<const std::string_view> keys, std::uint32_t layer,
                         std::span<const kv::Piece> pieces) override {
    return store_->store(keys, layer, pieces);
  }
  Result<kv::LayerResult> wait(kv::KvIo io, std::uint64_t timeout_ns) override { return store_->wait(io, timeout_ns); }
  Result<std::vector<kv::LayerResult>> wait_layer(std::uint32_t layer, std::uint64_t timeout_ns) override {
    return store_->wait_layer(layer, timeout_ns);
  }
  Result<std::vector<Status>> commit(std::span<const std::string_view> keys, std::uint64_t timeout_ns) override {
    return store_->commit(keys, timeout_ns);
  }
  Status discard(std::span<const std::string_view> keys) override { return store_->discard(keys); }
  Status pin(std::span<const std::string_view> keys) override { return store_->pin(keys); }
  Status unpin(std::span<const std::string_view> keys) override { return store_->unpin(keys); }
  Result<std::size_t> evict(std::span<const std::string_view> keys) override { return store_->evict(keys); }
  kv::Statistics statistics() const override { return store_->statistics(); }
  const kv::Namespace& name_space() const noexcept override { return store_->name_space(); }
  bool read_only() const noexcept override { return store_->read_only(); }

 private:
  std::unique_ptr<kv::KvStore<R>> store_;
};

/// A region registered through the store: where it starts and ends, for mapping views to pieces.
struct Region {
  std::uintptr_t end = 0;
  MemoryHandle handle;
  nb::object owner;
};

struct PyKvStore {
  std::shared_ptr<Core> core;  // keeps the runtime alive while the store lives
  std::unique_ptr<AnyKvStore> store;
  std::map<std::uintptr_t, Region> regions;  // by start address
  std::string directory;

  /// Destroys the store (it drains its IO for at most io_timeout_s, closes its files, unregisters its
  /// regions). The registered objects move to the runtime's keep-alive table: a region whose IO did
  /// not drain stays registered with the runtime, so its object lives until the runtime shuts down.
  void close() {
    if (store) {
      nb::gil_scoped_release release;
      store.reset();
    }
    for (auto& [start, region] : regions) core->owners.emplace(core->next_id++, std::move(region.owner));
    regions.clear();
  }
  ~PyKvStore() { close(); }
};

struct PyKvIo {
  kv::KvIo io;
  std::uint32_t layer = 0;
  bool load = true;
  std::size_t blocks = 0;
};

/// One block's outcome in a LayerResult or a commit.
struct PyBlockResult {
  std::size_t index = 0;
  nb::bytes key;
  StatusCode status = StatusCode::OK;
  std::string message;
  bool ok() const noexcept { return status == StatusCode::OK; }
};

struct PyLayerResult {
  std::uint32_t layer = 0;
  bool load = true;
  std::vector<PyBlockResult> blocks;
  std::size_t ok_blocks = 0;
  std::uint64_t bytes = 0;
  std::uint64_t verified_bytes = 0;
  std::uint64_t skipped_blocks = 0;
  Status status;
};

AnyKvStore& live(PyKvStore& self) {
  if (!self.store) raise_status(error(StatusCode::NOT_FOUND, "KvStore '{}' was closed", self.directory));
  return *self.store;
}

/// Keys as views of the bytes objects in `keys` (kept alive by the caller's list during the call).
std::vector<std::string_view> key_views(nb::handle keys, std::vector<nb::object>& hold) {
  if (!PySequence_Check(keys.ptr()) || nb::isinstance<nb::bytes>(keys) || nb::isinstance<nb::str>(keys))
    raise_status(error(StatusCode::INVALID_ARGUMENT, "keys must be a list of bytes (the engine's block hashes)"));
  const Py_ssize_t n = PySequence_Size(keys.ptr());
  std::vector<std::string_view> out;
  out.reserve(static_cast<std::size_t>(n));
  hold.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::object key = nb::steal(PySequence_GetItem(keys.ptr(), i));
    if (!key.is_valid()) throw nb::python_error();
    if (!PyBytes_Check(key.ptr()))
      raise_status(error(StatusCode::INVALID_ARGUMENT, "keys[{}] is a {}, not bytes", i,
                         nb::cast<std::string>(nb::str(key.type().attr("__qualname__")))));
    out.emplace_back(PyBytes_AS_STRING(key.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(key.ptr())));
    hold.push_back(std::move(key));
  }
  return out;
}

/// The registered region holding [address, address + bytes) (its start and entry), or
/// INVALID_ARGUMENT naming `field`.
std::pair<std::uintptr_t, const Region*> region_of(PyKvStore& self, std::uintptr_t address, std::uint64_t bytes,
                                                   const std::string& field) {
  auto it = self.regions.upper_bound(address);
  if (it != self.regions.begin()) {
    --it;
    if (address >= it->first && address + bytes <= it->second.end) return {it->first, &it->second};
  }
  raise_status(error(StatusCode::INVALID_ARGUMENT,
                     "{}: {} bytes at {:#x} are not inside a region registered with this KvStore (KvStore.register)",
                     field, bytes, address));
}

/// Pieces for `keys` from either (tensor, blocks) or a list of tensors (one per key and piece).
std::vector<kv::Piece> pieces_of(PyKvStore& self, std::size_t keys, nb::handle tensors, nb::handle blocks,
                                 std::string_view field) {
  const kv::Namespace& ns = live(self).name_space();
  const std::size_t P = ns.piece_bytes.size();
  std::vector<kv::Piece> out;
  out.reserve(keys * P);
  auto view_of_array = [&](nb::handle obj, const std::string& name) {
    nb::ndarray<> array;
    if (!nb::try_cast(obj, array, /*convert=*/false))
      raise_status(error(StatusCode::INVALID_ARGUMENT, "{} is a {}, not a tensor or array", name,
                         nb::cast<std::string>(nb::str(obj.type().attr("__qualname__")))));
    if (const std::string problem = dense_problem(array); !problem.empty())  // its bytes must be one range
      raise_status(error(StatusCode::INVALID_ARGUMENT, "{}: {}", name, problem));
    return array;
  };
  if (blocks.is_none()) {
    if (!PySequence_Check(tensors.ptr()))
      raise_status(
          error(StatusCode::INVALID_ARGUMENT,
                "{} must be a list of tensors (one per key and piece) or one registered tensor with blocks=", field));
    const Py_ssize_t n = PySequence_Size(tensors.ptr());
    if (static_cast<std::size_t>(n) != keys * P)
      raise_status(error(StatusCode::INVALID_ARGUMENT,
                         "{} has {} tensors; {} keys x {} pieces per block (namespace.piece_bytes) need {}", field, n,
                         keys, P, keys * P));
    for (Py_ssize_t i = 0; i < n; ++i) {
      nb::object item = nb::steal(PySequence_GetItem(tensors.ptr(), i));
      const std::string name = fmt::format("{}[{}]", field, i);
      nb::ndarray<> array = view_of_array(item, name);
      const auto address = reinterpret_cast<std::uintptr_t>(array.data());
      const auto [start, region] = region_of(self, address, array.nbytes(), name);
      out.push_back({region->handle, address - start, array.nbytes()});
    }
    return out;
  }
  // One tensor, one block index per key: block b is tensor[b] (its first dimension), split into the
  // namespace's pieces in order.
  nb::ndarray<> array = view_of_array(tensors, std::string(field));
  if (array.ndim() < 1)
    raise_status(error(StatusCode::INVALID_ARGUMENT, "{} has 0 dimensions; blocks index its first", field));
  const auto base = reinterpret_cast<std::uintptr_t>(array.data());
  const auto [start, region] = region_of(self, base, array.nbytes(), std::string(field));
  const std::uint64_t row_bytes = array.nbytes() / array.shape(0);
  if (array.shape(0) > 1 && static_cast<std::uint64_t>(array.stride(0)) * array.itemsize() != row_bytes)
    raise_status(error(StatusCode::INVALID_ARGUMENT,
                       "{}: dimension 0 (the block index) has a stride of {} elements; blocks= needs it outermost "
                       "({} bytes per block)",
                       field, array.stride(0), row_bytes));
  if (row_bytes != ns.layer_block_bytes())
    raise_status(error(StatusCode::INVALID_ARGUMENT,
                       "{}: a block ({}[b]) has {} bytes; the namespace's block has {} (sum of piece_bytes)", field,
                       field, row_bytes, ns.layer_block_bytes()));
  std::vector<std::int64_t> indices;
  nb::ndarray<> index_array;
  if (nb::try_cast(blocks, index_array, false) && index_array.device_type() == nb::device::cpu::value &&
      index_array.ndim() == 1 && index_array.dtype() == nb::dtype<std::int64_t>()) {
    const auto* data = static_cast<const std::int64_t*>(index_array.data());
    for (std::size_t i = 0; i < index_array.shape(0); ++i) indices.push_back(data[i * index_array.stride(0)]);
  } else {
    indices = nb::cast<std::vector<std::int64_t>>(blocks);
  }
  if (indices.size() != keys)
    raise_status(
        error(StatusCode::INVALID_ARGUMENT, "blocks has {} entries; one per key ({}) is needed", indices.size(), keys));
  for (std::size_t k = 0; k < keys; ++k) {
    if (indices[k] < 0 || static_cast<std::size_t>(indices[k]) >= array.shape(0))
      raise_status(error(StatusCode::OUT_OF_RANGE, "blocks[{}] = {} is outside 0..{} ({} has {} blocks)", k, indices[k],
                         array.shape(0) - 1, field, array.shape(0)));
    std::uint64_t offset = base - start + static_cast<std::uint64_t>(indices[k]) * row_bytes;
    for (std::size_t p = 0; p < P; ++p) {
      out.push_back({region->handle, offset, ns.piece_bytes[p]});
      offset += ns.piece_bytes[p];
    }
  }
  return out;
}

PyLayerResult to_python(const kv::LayerResult& r, const std::vector<nb::object>* keys) {
  PyLayerResult out;
  out.layer = r.layer;
  out.load = r.operation == kv::KvOperation::LOAD;
  out.ok_blocks = r.ok_blocks;
  out.bytes = r.bytes;
  out.verified_bytes = r.verified_bytes;
  out.skipped_blocks = r.skipped_blocks;
  out.status = r.status;
  for (std::size_t k = 0; k < r.blocks.size(); ++k) {
    PyBlockResult b;
    b.index = k;
    if (keys && k < keys->size()) b.key = nb::borrow<nb::bytes>((*keys)[k]);
    b.status = r.blocks[k].code();
    b.message = r.blocks[k].message();
    out.blocks.push_back(std::move(b));
  }
  return out;
}

[[noreturn]] void raise_with(const Status& status, const char* attribute, nb::object value) {
  nb::object exc = exception_for(status);
  nb::setattr(exc, attribute, value);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

kv::Namespace namespace_of(nb::handle spec) {
  if (!PyDict_Check(spec.ptr()))
    raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace must be a dict of the namespace fields"));
  kv::Namespace ns;
  nb::dict d = nb::borrow<nb::dict>(spec);
  for (auto [key, value] : d) {
    const std::string name = nb::cast<std::string>(key);
    auto text = [&](std::string& field) {
      if (!nb::isinstance<nb::str>(value))
        raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace.{} must be a str", name));
      field = nb::cast<std::string>(value);
    };
    auto number = [&](std::uint32_t& field) {
      if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr()))
        raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace.{} must be an int", name));
      const long long v = PyLong_AsLongLong(value.ptr());
      if (PyErr_Occurred() || v < 0 || v > 0xffffffffLL) {
        PyErr_Clear();
        raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace.{} = {} is outside 0..2^32-1", name,
                           nb::cast<std::string>(nb::repr(value))));
      }
      field = static_cast<std::uint32_t>(v);
    };
    auto flag = [&](bool& field) {
      if (!PyBool_Check(value.ptr()))
        raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace.{} must be a bool", name));
      field = value.ptr() == Py_True;
    };
    if (name == "model")
      text(ns.model);
    else if (name == "dtype")
      text(ns.dtype);
    else if (name == "tensor_layout")
      text(ns.tensor_layout);
    else if (name == "kv_split")
      flag(ns.kv_split);
    else if (name == "cross_layer")
      flag(ns.cross_layer);
    else if (name == "tp_rank")
      number(ns.tp_rank);
    else if (name == "tp_size")
      number(ns.tp_size);
    else if (name == "pp_stage")
      number(ns.pp_stage);
    else if (name == "pp_size")
      number(ns.pp_size);
    else if (name == "block_tokens")
      number(ns.block_tokens);
    else if (name == "layers")
      number(ns.layers);
    else if (name == "hash_algorithm")
      text(ns.hash_algorithm);
    else if (name == "hash_seed")
      text(ns.hash_seed);
    else if (name == "piece_bytes") {
      std::vector<std::int64_t> pieces;
      if (!nb::try_cast(value, pieces))
        raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace.piece_bytes must be a list of ints (bytes)"));
      for (std::size_t j = 0; j < pieces.size(); ++j) {
        if (pieces[j] < 0)
          raise_status(error(StatusCode::INVALID_ARGUMENT, "namespace.piece_bytes[{}] = {} is negative", j, pieces[j]));
        ns.piece_bytes.push_back(static_cast<std::uint64_t>(pieces[j]));
      }
    } else {
      raise_status(error(StatusCode::INVALID_ARGUMENT,
                         "namespace: unknown field '{}'; fields: model, dtype, tensor_layout, kv_split, cross_layer, "
                         "tp_rank, tp_size, pp_stage, pp_size, block_tokens, layers, piece_bytes, hash_algorithm, "
                         "hash_seed",
                         name));
    }
  }
  return ns;
}

template <class R>
std::unique_ptr<AnyKvStore> open_store(R& runtime, const std::string& directory, const kv::Namespace& ns,
                                       const kv::StoreOptions& options) {
  Result<std::unique_ptr<kv::KvStore<R>>> opened = [&] {
    nb::gil_scoped_release release;
    return kv::KvStore<R>::open(runtime, directory, ns, options);
  }();
  return std::make_unique<KvModel<R>>(check(std::move(opened)));
}

PyKvIo submit(PyKvStore& self, bool load, Keys keys, std::uint32_t layer, nb::handle tensors, nb::handle blocks) {
  AnyKvStore& store = live(self);
  std::vector<nb::object> hold;
  const std::vector<std::string_view> views = key_views(keys, hold);
  const std::vector<kv::Piece> pieces =
      pieces_of(self, views.size(), tensors, blocks, load ? "destinations" : "sources");
  Result<kv::KvIo> io = [&] {
    nb::gil_scoped_release release;  // a store checksums its sources here (host memory, CPU time)
    return load ? store.load(views, layer, pieces) : store.store(views, layer, pieces);
  }();
  return PyKvIo{check(std::move(io)), layer, load, views.size()};
}

PyLayerResult wait(PyKvStore& self, const PyKvIo& io, double timeout_s, bool check_result) {
  AnyKvStore& store = live(self);
  const std::uint64_t budget = seconds_to_ns(timeout_s, "KvStore.wait: timeout_s");
  Result<kv::LayerResult> last = error(StatusCode::TIMEOUT, "not complete");
  const bool finished = wait_in_slices(budget, [&](std::uint64_t slice) {
    last = store.wait(io.io, slice);
    return last.is_ok() || last.code() != StatusCode::TIMEOUT;
  });
  if (!finished)
    raise_status(error(StatusCode::TIMEOUT,
                       "KvStore.wait: layer {} {} not complete after timeout_s = {} s; it stays "
                       "in flight, wait again",
                       io.layer, io.load ? "load" : "store", timeout_s));
  PyLayerResult result = to_python(check(std::move(last)), nullptr);
  if (check_result && !result.status.is_ok()) raise_with(result.status, "result", nb::cast(result));
  return result;
}

}  // namespace

void define_kv(nb::module_& m) {
  nb::class_<PyBlockResult>(m, "BlockResult", "One block's outcome in a LayerResult or a commit.")
      .def_ro("index", &PyBlockResult::index, "Index of the key in the call.")
      .def_ro("key", &PyBlockResult::key, "The key (bytes; commit only, b'' in layer results).")
      .def_ro("status", &PyBlockResult::status, "StatusCode.OK, NOT_FOUND (not stored), DATA_LOSS (checksum) ...")
      .def_ro("message", &PyBlockResult::message)
      .def_prop_ro("ok", &PyBlockResult::ok)
      .def("__repr__", [](const PyBlockResult& self) {
        return fmt::format("<tutti.BlockResult [{}] {}{}{}>", self.index, to_string(self.status),
                           self.message.empty() ? "" : ": ", self.message);
      });
  nb::class_<PyLayerResult>(m, "LayerResult", "The outcome of one load or store of one layer.")
      .def_ro("layer", &PyLayerResult::layer)
      .def_ro("load", &PyLayerResult::load, "True for a load, False for a store.")
      .def_ro("blocks", &PyLayerResult::blocks, "BlockResult per key, in call order.")
      .def_ro("ok_blocks", &PyLayerResult::ok_blocks)
      .def_ro("bytes", &PyLayerResult::bytes, "Bytes moved for the OK blocks (piece lengths).")
      .def_ro("verified_bytes", &PyLayerResult::verified_bytes, "Bytes whose checksum matched (loads).")
      .def_ro("skipped_blocks", &PyLayerResult::skipped_blocks, "Stores of keys already visible (nothing written).")
      .def_prop_ro("ok", [](const PyLayerResult& self) { return self.status.is_ok(); })
      .def("__repr__", [](const PyLayerResult& self) {
        return fmt::format("<tutti.LayerResult layer {} {}: {} of {} blocks OK, {} bytes{}{}>", self.layer,
                           self.load ? "load" : "store", self.ok_blocks, self.blocks.size(), self.bytes,
                           self.status.is_ok() ? "" : ", ", self.status.is_ok() ? "" : self.status.to_string());
      });
  nb::class_<PyKvIo>(m, "KvIo", "One submitted load or store of one layer; wait for it with KvStore.wait.")
      .def_ro("layer", &PyKvIo::layer)
      .def_ro("load", &PyKvIo::load)
      .def_ro("blocks", &PyKvIo::blocks, "Number of keys.")
      .def("__repr__", [](const PyKvIo& self) {
        return fmt::format("<tutti.KvIo #{} layer {} {} of {} blocks>", self.io.id, self.layer,
                           self.load ? "load" : "store", self.blocks);
      });

  nb::class_<PyKvStore>(
      m, "KvStore",
      "KV-cache blocks by the engine's block hash in preallocated files under one directory (docs/kv-store.md).\n\n"
      "KvStore(runtime, directory, namespace, capacity_bytes=0, read_only=False, create_if_missing=True, "
      "unsafe_skip_verification=False, io_timeout_s=60.0, host_checksum_threads=0): opens or creates the store; "
      "`namespace` is a dict of the kv::Namespace fields (model, dtype, block_tokens, layers, piece_bytes, "
      "hash_algorithm ...). Keys are bytes (1..64). A block is visible only after commit().\n\n"
      "Raises tutti.InvalidArgument (a namespace field, or a namespace differing from the stored one: every "
      "differing field named), tutti.Busy (another process is the writer: its pid is named), tutti.NotFound "
      "(no store and read_only or not create_if_missing), tutti.ResourceExhausted (not enough free space), "
      "tutti.DataLoss (a layer file of the wrong size).\n\nThread-safety: any thread.")
      .def(
          "__init__",
          [](PyKvStore* self, nb::handle runtime, const std::string& directory, nb::handle ns, std::uint64_t capacity,
             bool read_only, bool create_if_missing, bool unsafe_skip_verification, double io_timeout_s,
             std::uint32_t host_checksum_threads) {
            PyRuntime* owner = nullptr;
            if (!nb::try_cast(runtime, owner) || owner == nullptr)
              raise_status(error(StatusCode::INVALID_ARGUMENT, "KvStore: runtime must be a tutti.Runtime"));
            const std::shared_ptr<Core>* core = &owner->core;
            if (!*core || !(*core)->runtime)
              raise_status(error(StatusCode::NOT_FOUND, "KvStore: the runtime was destroyed"));
            kv::StoreOptions options;
            options.capacity_bytes = capacity;
            options.read_only = read_only;
            options.create_if_missing = create_if_missing;
            options.unsafe_skip_verification = unsafe_skip_verification;
            options.io_timeout_ns = seconds_to_ns(io_timeout_s, "KvStore: io_timeout_s");
            options.host_checksum_threads = host_checksum_threads;
            const kv::Namespace name_space = namespace_of(ns);
            AnyRuntime& rt = *(*core)->runtime;
            std::unique_ptr<AnyKvStore> store;
            if (rt.backend() == "uring") {
              store = open_store(*static_cast<UringRuntime*>(rt.native()), directory, name_space, options);
#if TUTTI_PYTHON_KV_NVME_SOFT
            } else if (rt.backend() == "nvme-soft") {
              store = open_store(*static_cast<LocalNvmeRuntime*>(rt.native()), directory, name_space, options);
#endif
            } else {
              raise_status(error(StatusCode::UNSUPPORTED,
                                 "KvStore: the {} backend has no files; use a 'uring' or 'nvme-soft' Runtime",
                                 rt.backend()));
            }
            new (self) PyKvStore{*core, std::move(store), {}, directory};
          },
          nb::arg("runtime"), nb::arg("directory"), nb::arg("namespace"), nb::arg("capacity_bytes") = 0,
          nb::arg("read_only") = false, nb::arg("create_if_missing") = true,
          nb::arg("unsafe_skip_verification") = false, nb::arg("io_timeout_s") = 60.0,
          nb::arg("host_checksum_threads") = 0)
      .def_prop_ro("directory", [](const PyKvStore& self) { return self.directory; })
      .def_prop_ro("read_only", [](PyKvStore& self) { return live(self).read_only(); })
      .def_prop_ro(
          "namespace",
          [](PyKvStore& self) {
            const kv::Namespace& ns = live(self).name_space();
            nb::dict d;
            d["model"] = ns.model;
            d["dtype"] = ns.dtype;
            d["tensor_layout"] = ns.tensor_layout;
            d["kv_split"] = ns.kv_split;
            d["cross_layer"] = ns.cross_layer;
            d["tp_rank"] = ns.tp_rank;
            d["tp_size"] = ns.tp_size;
            d["pp_stage"] = ns.pp_stage;
            d["pp_size"] = ns.pp_size;
            d["block_tokens"] = ns.block_tokens;
            d["layers"] = ns.layers;
            d["piece_bytes"] = ns.piece_bytes;
            d["hash_algorithm"] = ns.hash_algorithm;
            d["hash_seed"] = ns.hash_seed;
            return d;
          },
          "The store's namespace as a dict.")
      .def(
          "register",
          [](PyKvStore& self, nb::handle obj) {
            AnyKvStore& store = live(self);
            nb::ndarray<> array;
            if (!nb::try_cast(obj, array, /*convert=*/false))
              raise_status(error(StatusCode::INVALID_ARGUMENT,
                                 "KvStore.register: an object of type {} is not a writable tensor or array",
                                 nb::cast<std::string>(nb::str(obj.type().attr("__qualname__")))));
            if (const std::string problem = dense_problem(array); !problem.empty())
              raise_status(error(StatusCode::INVALID_ARGUMENT, "KvStore.register: {}", problem));
            MemoryView view;
            view.address = array.data();
            view.size = array.nbytes();
            if (array.device_type() == nb::device::cuda::value) {
              view.kind = MemoryKind::DEVICE;
              view.accelerator_id = array.device_id();
            } else if (array.device_type() == nb::device::cuda_host::value) {
              view.kind = MemoryKind::PINNED_HOST;
            } else if (array.device_type() != nb::device::cpu::value) {
              raise_status(error(StatusCode::UNSUPPORTED,
                                 "KvStore.register: DLPack device type {} is not CPU or "
                                 "CUDA memory",
                                 array.device_type()));
            }
            Result<MemoryHandle> registered = [&] {
              nb::gil_scoped_release release;
              return store.register_memory(view);
            }();
            const MemoryHandle handle = check(std::move(registered));
            const auto start = reinterpret_cast<std::uintptr_t>(view.address);
            self.regions[start] = Region{start + view.size, handle, nb::borrow(obj)};
            return nb::borrow(obj);
          },
          nb::arg("tensor"),
          "Registers a tensor or array with the runtime and the store (no copy) and returns it. Pieces passed to "
          "load and store must lie inside registered tensors; the store keeps them alive until unregister.\n\n"
          "Raises tutti.InvalidArgument (not an array), tutti.Unsupported (a memory kind the runtime cannot take).")
      .def(
          "unregister",
          [](PyKvStore& self, nb::handle obj) {
            AnyKvStore& store = live(self);
            nb::ndarray<> array;
            if (!nb::try_cast(obj, array, false))
              raise_status(error(StatusCode::INVALID_ARGUMENT, "KvStore.unregister: not a tensor or array"));
            auto it = self.regions.find(reinterpret_cast<std::uintptr_t>(array.data()));
            if (it == self.regions.end())
              raise_status(error(StatusCode::NOT_FOUND, "KvStore.unregister: this tensor is not registered here"));
            Status s;
            {
              nb::gil_scoped_release release;
              s = store.unregister_memory(it->second.handle);
            }
            if (s.code() != StatusCode::BUSY) self.regions.erase(it);
            check(s);
          },
          nb::arg("tensor"), "Unregisters a tensor. Raises tutti.Busy while IO using it is in flight.")
      .def(
          "lookup",
          [](PyKvStore& self, Keys keys) {
            AnyKvStore& store = live(self);
            std::vector<nb::object> hold;
            const auto views = key_views(keys, hold);
            Result<std::size_t> n = [&] {
              nb::gil_scoped_release release;
              return store.lookup(views);
            }();
            return check(std::move(n));
          },
          nb::arg("keys"), "The number of leading keys whose blocks are visible (the stored prefix, in blocks).")
      .def(
          "load",
          [](PyKvStore& self, Keys keys, std::uint32_t layer, nb::handle destinations, nb::handle blocks) {
            return submit(self, true, keys, layer, destinations, blocks);
          },
          nb::arg("keys"), nb::arg("layer"), nb::arg("destinations"), nb::arg("blocks") = nb::none(),
          "Reads layer `layer` of each key's block in ONE runtime submit and returns a KvIo (wait for it with "
          "wait or wait_layer; the bytes are verified there).\n\n"
          "destinations: one registered tensor with blocks= (one block index per key: key k goes to "
          "destinations[blocks[k]], split into the namespace's pieces in order), or a list of tensors, one per key "
          "and piece (views inside registered tensors). Raises tutti.InvalidArgument / tutti.OutOfRange for bad "
          "keys, layer, pieces or alignment (nothing submitted). Per-block failures (NOT_FOUND, DATA_LOSS ...) "
          "come in the LayerResult.")
      .def(
          "store",
          [](PyKvStore& self, Keys keys, std::uint32_t layer, nb::handle sources, nb::handle blocks) {
            return submit(self, false, keys, layer, sources, blocks);
          },
          nb::arg("keys"), nb::arg("layer"), nb::arg("sources"), nb::arg("blocks") = nb::none(),
          "Writes layer `layer` of each key's block in ONE runtime submit (checksums computed first, GIL "
          "released) and returns a KvIo. Sources as load's destinations; they must not change until the wait. "
          "Blocks become visible at commit().\n\nRaises as load, and tutti.Unsupported on a reader, "
          "tutti.InvalidArgument for a key repeated in the call.")
      .def(
          "load_layers",
          [](PyKvStore& self, Keys keys, nb::handle per_layer, nb::handle blocks) {
            std::vector<PyKvIo> out;
            const Py_ssize_t n = PySequence_Size(per_layer.ptr());
            if (n < 0) throw nb::python_error();
            for (Py_ssize_t l = 0; l < n; ++l)
              out.push_back(submit(self, true, keys, static_cast<std::uint32_t>(l),
                                   nb::steal(PySequence_GetItem(per_layer.ptr(), l)), blocks));
            return out;
          },
          nb::arg("keys"), nb::arg("destinations"), nb::arg("blocks"),
          "load() of every layer l into destinations[l] (a list of tensors, one per layer, e.g. vLLM's KV "
          "caches), with the same keys and block indices; returns the KvIo of each layer. Then wait_layer(l) as "
          "compute reaches layer l.")
      .def(
          "store_layers",
          [](PyKvStore& self, Keys keys, nb::handle per_layer, nb::handle blocks) {
            std::vector<PyKvIo> out;
            const Py_ssize_t n = PySequence_Size(per_layer.ptr());
            if (n < 0) throw nb::python_error();
            for (Py_ssize_t l = 0; l < n; ++l)
              out.push_back(submit(self, false, keys, static_cast<std::uint32_t>(l),
                                   nb::steal(PySequence_GetItem(per_layer.ptr(), l)), blocks));
            return out;
          },
          nb::arg("keys"), nb::arg("sources"), nb::arg("blocks"),
          "store() of every layer l from sources[l] (one tensor per layer); returns the KvIo of each layer.")
      .def("wait", &wait, nb::arg("io"), nb::arg("timeout_s"), nb::arg("check") = true,
           "Waits at most timeout_s seconds for a KvIo (GIL released, Ctrl-C interrupts), verifies loaded blocks "
           "and returns its LayerResult (once: the KvIo is then spent).\n\n"
           "Raises tutti.TimeoutError (wait again), tutti.NotFound (spent or unknown KvIo), tutti.Busy (another "
           "thread waits for it); with check=True the first failed block's error, `.result` = the LayerResult.")
      .def(
          "wait_layer",
          [](PyKvStore& self, std::uint32_t layer, double timeout_s, bool check_result) {
            AnyKvStore& store = live(self);
            const std::uint64_t budget = seconds_to_ns(timeout_s, "KvStore.wait_layer: timeout_s");
            Result<std::vector<kv::LayerResult>> last = error(StatusCode::TIMEOUT, "not complete");
            const bool finished = wait_in_slices(budget, [&](std::uint64_t slice) {
              last = store.wait_layer(layer, slice);
              return last.is_ok() || last.code() != StatusCode::TIMEOUT;
            });
            if (!finished)
              raise_status(error(StatusCode::TIMEOUT,
                                 "KvStore.wait_layer({}): not complete after timeout_s = {} s; the completed results "
                                 "are kept, wait again",
                                 layer, timeout_s));
            std::vector<PyLayerResult> out;
            for (const kv::LayerResult& r : check(std::move(last))) out.push_back(to_python(r, nullptr));
            if (check_result)
              for (const PyLayerResult& r : out)
                if (!r.status.is_ok()) raise_with(r.status, "results", nb::cast(out));
            return out;
          },
          nb::arg("layer"), nb::arg("timeout_s"), nb::arg("check") = true,
          "Waits for every load and store of `layer` submitted so far and returns their LayerResults in "
          "submission order (layer-wise overlap: compute layer l while l+1.. load).\n\nRaises "
          "tutti.TimeoutError (results of those that completed are kept), tutti.InvalidArgument (layer out of "
          "range); with check=True the first failed block's error, `.results` = the list.")
      .def(
          "commit",
          [](PyKvStore& self, Keys keys, double timeout_s, bool check_result) {
            AnyKvStore& store = live(self);
            std::vector<nb::object> hold;
            const auto views = key_views(keys, hold);
            const std::uint64_t budget = seconds_to_ns(timeout_s, "KvStore.commit: timeout_s");
            Result<std::vector<Status>> committed = [&] {
              nb::gil_scoped_release release;
              return store.commit(views, budget);
            }();
            std::vector<PyBlockResult> out;
            std::optional<Status> first;
            const auto statuses = check(std::move(committed));
            for (std::size_t k = 0; k < statuses.size(); ++k) {
              out.push_back({k, nb::borrow<nb::bytes>(hold[k]), statuses[k].code(), statuses[k].message()});
              if (!statuses[k].is_ok() && !first) first = statuses[k].with_context(fmt::format("keys[{}]", k));
            }
            if (check_result && first) raise_with(*first, "results", nb::cast(out));
            return out;
          },
          nb::arg("keys"), nb::arg("timeout_s") = 60.0, nb::arg("check") = true,
          "Makes the keys' fully stored blocks visible (flush of the written layer files, then one index "
          "transaction) and returns a BlockResult per key: OK, NOT_FOUND (never stored), NOT_READY (layers "
          "missing: it stays pending) or the failure that dropped the block.\n\nRaises tutti.TimeoutError (flush "
          "not done: commit again), tutti.Unsupported (reader); with check=True the first failed key's error, "
          "`.results` = the list.")
      .def(
          "discard",
          [](PyKvStore& self, Keys keys) {
            std::vector<nb::object> hold;
            const auto views = key_views(keys, hold);
            check(live(self).discard(views));
          },
          nb::arg("keys"),
          "Drops the keys' pending (uncommitted) blocks. Raises tutti.Busy while a layer is in flight.")
      .def(
          "pin",
          [](PyKvStore& self, Keys keys) {
            std::vector<nb::object> hold;
            const auto views = key_views(keys, hold);
            check(live(self).pin(views));
          },
          nb::arg("keys"),
          "Pins visible blocks (counted) so eviction skips them. Raises tutti.NotFound naming the "
          "first key not visible (nothing pinned).")
      .def(
          "unpin",
          [](PyKvStore& self, Keys keys) {
            std::vector<nb::object> hold;
            const auto views = key_views(keys, hold);
            check(live(self).unpin(views));
          },
          nb::arg("keys"), "Undoes pin(). Raises tutti.InvalidArgument for a key not pinned (nothing unpinned).")
      .def(
          "evict",
          [](PyKvStore& self, Keys keys) {
            std::vector<nb::object> hold;
            const auto views = key_views(keys, hold);
            Result<std::size_t> n = [&] {
              nb::gil_scoped_release release;
              return live(self).evict(views);
            }();
            return check(std::move(n));
          },
          nb::arg("keys"), "Removes visible, unpinned blocks; returns how many were evicted.")
      .def(
          "statistics",
          [](PyKvStore& self) {
            const kv::Statistics s = live(self).statistics();
            nb::dict d;
#define TUTTI_FIELD(name) d[#name] = s.name
            TUTTI_FIELD(lookups);
            TUTTI_FIELD(lookup_keys);
            TUTTI_FIELD(lookup_hits);
            TUTTI_FIELD(load_blocks);
            TUTTI_FIELD(hits);
            TUTTI_FIELD(misses);
            TUTTI_FIELD(load_failures);
            TUTTI_FIELD(verification_failures);
            TUTTI_FIELD(loaded_bytes);
            TUTTI_FIELD(verified_bytes);
            TUTTI_FIELD(stored_layer_blocks);
            TUTTI_FIELD(stored_bytes);
            TUTTI_FIELD(store_failures);
            TUTTI_FIELD(committed_blocks);
            TUTTI_FIELD(commit_failures);
            TUTTI_FIELD(evictions);
            TUTTI_FIELD(resubmits);
            TUTTI_FIELD(dropped_records);
            TUTTI_FIELD(visible_blocks);
            TUTTI_FIELD(pending_blocks);
            TUTTI_FIELD(slots);
            TUTTI_FIELD(capacity_bytes);
#undef TUTTI_FIELD
            return d;
          },
          "A snapshot of the store's counters (docs/kv-store.md) as a dict of ints.")
      .def(
          "close", [](PyKvStore& self) { self.close(); },
          "Closes the store: waits at most io_timeout_s for its IO, closes the layer files and unregisters the "
          "tensors registered through it. Idempotent.")
      .def("__enter__", [](nb::handle self) { return self; })
      .def(
          "__exit__",
          [](PyKvStore& self, nb::handle, nb::handle, nb::handle) {
            self.close();
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc").none(), nb::arg("traceback").none());
}

}  // namespace tutti::python
