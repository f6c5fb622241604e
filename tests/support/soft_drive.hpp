// SoftDrive: one soft controller (libnvm, the NVMe Base Specification's controller in software) on
// a pattern-filled temporary backing file (or in null mode, no file), opened through its driver and
// brought up, for the local_nvme and striped_nvme test rigs; the file is removed on destruction.
// Users link libnvm and put tests/local_file on their include path (write_pattern_file). Failures
// stop the test case (doctest REQUIRE) with the Status's message. Not thread-safe.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <doctest/doctest.h>

#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/nvme/controller.hpp>

#include "test_files.hpp"  // tests/local_file: write_pattern_file

namespace tutti::testing {

/// One soft controller, its driver (nvme::Controller, brought up) and its backing file.
struct SoftDrive {
  /// Unless config.null_mode: a backing file of `backing_bytes` under /tmp named `prefix`XXXXXX,
  /// filled by write_pattern_file(seed), becomes config.backing_path. config.scatter_bus_pages is set.
  SoftDrive(libnvm::SoftControllerConfig config, std::uint64_t backing_bytes, std::uint64_t seed,
            const std::string& prefix = "/tmp/tutti-soft-") {
    if (!config.null_mode) {
      std::string name = prefix + "XXXXXX";
      const int fd = ::mkstemp(name.data());
      REQUIRE(fd >= 0);
      ::close(fd);
      backing = name;
      write_pattern_file(backing, seed, backing_bytes);
      config.backing_path = backing;
    }
    config.scatter_bus_pages = true;
    auto d = libnvm::SoftController::create(config);
    REQUIRE_MESSAGE(d.is_ok(), d.status().to_string());
    device = *d;
    auto c = libnvm::open_soft_controller(device);
    REQUIRE_MESSAGE(c.is_ok(), c.status().to_string());
    controller = std::move(c.value());
    const Status up = controller->bring_up({});
    REQUIRE_MESSAGE(up.is_ok(), up.to_string());
  }
  ~SoftDrive() {
    controller.reset();
    device.reset();
    if (!backing.empty()) ::unlink(backing.c_str());
  }
  SoftDrive(const SoftDrive&) = delete;
  SoftDrive& operator=(const SoftDrive&) = delete;

  std::string backing;  ///< the namespace's backing file; empty in null mode
  std::shared_ptr<libnvm::SoftController> device;
  std::unique_ptr<nvme::Controller> controller;
};

}  // namespace tutti::testing
