// tutti._tutti: the extension module. Enums, build_info, then errors, the runtime and the KV store.
#include <nanobind/stl/string.h>

#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>

#include "ext.hpp"

using namespace tutti;
using namespace tutti::python;

NB_MODULE(_tutti, m) {
  m.doc() = "Tutti's C++ runtime (nanobind extension). Import the package `tutti`, not this module.";
  // Objects a runtime keeps on purpose (IO that never drained: never freed under DMA) are not leaks.
  nb::set_leak_warnings(false);

  nb::enum_<StatusCode>(m, "StatusCode",
                        "The code of a Status (tutti::StatusCode); each non-OK one has an error class.")
      .value("OK", StatusCode::OK)
      .value("INVALID_ARGUMENT", StatusCode::INVALID_ARGUMENT)
      .value("OUT_OF_RANGE", StatusCode::OUT_OF_RANGE)
      .value("NOT_FOUND", StatusCode::NOT_FOUND)
      .value("UNSUPPORTED", StatusCode::UNSUPPORTED)
      .value("NOT_READY", StatusCode::NOT_READY)
      .value("BUSY", StatusCode::BUSY)
      .value("RESOURCE_EXHAUSTED", StatusCode::RESOURCE_EXHAUSTED)
      .value("TIMEOUT", StatusCode::TIMEOUT)
      .value("DEVICE_ERROR", StatusCode::DEVICE_ERROR)
      .value("DATA_LOSS", StatusCode::DATA_LOSS)
      .value("INTERNAL", StatusCode::INTERNAL);
  nb::enum_<Direction>(m, "Direction",
                       "What a request does: READ (target -> memory), WRITE (memory -> target), "
                       "FLUSH (make completed writes durable).")
      .value("READ", Direction::READ)
      .value("WRITE", Direction::WRITE)
      .value("FLUSH", Direction::FLUSH);
  nb::enum_<MemoryKind>(m, "MemoryKind", "Where a registered region lives.")
      .value("HOST", MemoryKind::HOST)
      .value("PINNED_HOST", MemoryKind::PINNED_HOST)
      .value("DEVICE", MemoryKind::DEVICE);

  define_errors(m);

  m.def(
      "build_info",
      [] {
        nb::dict info;
        info["version"] = TUTTI_PYTHON_VERSION;
        info["accelerator"] = TUTTI_PYTHON_ACCELERATOR;
        nb::list backends;
        backends.append("uring");
        // nvme-soft: wherever libnvm is in the package (host build: host threads drive the soft controller;
        // CUDA build: GPU threads, the controller in accelerator_mode).
        if (TUTTI_PYTHON_NVME_SOFT) backends.append("nvme-soft");
        backends.append("memfs");
        info["backends"] = backends;
        info["kv_store"] = TUTTI_PYTHON_KV != 0;
        info["nanobind"] = TUTTI_PYTHON_NANOBIND_VERSION;
        return info;
      },
      "What was built: {'version', 'accelerator': 'host' | 'cuda', 'backends', 'kv_store', 'nanobind'}.");
  m.attr("ALIGNMENT") = 4096;

  define_runtime(m);
#if TUTTI_PYTHON_KV
  define_kv(m);
#endif
}
