// The io_uring of the uring DataPath: creation, the SQ, the CQ, the timed wait and teardown, on
// liburing. Part of tutti/path/uring.hpp (include that).
//
// One ring per DataPath: Options::queue_depth SQ entries and twice as many CQ entries
// (IORING_SETUP_CQSIZE, so the CQ cannot overflow while at most queue_depth commands are in flight),
// IORING_SETUP_SQPOLL when asked.
//
// Thread-safety: none of its own. The Engine calls get_sqe / submit with its submission mutex held
// and wait_for_cqe / for_each_cqe with its completion mutex held; the registration calls are
// io_uring_register(2) system calls, which the kernel serialises.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <thread>

#include <fmt/format.h>

#include <tutti/core/errno.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/uring/options.hpp>

namespace tutti::uring::detail {

class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() { close(); }

  /// io_uring_queue_init_params with the options' depths and SQPOLL. Errors: the kernel's refusal,
  /// from its errno (status_from_errno: ENOMEM / EMFILE -> RESOURCE_EXHAUSTED, ENOSYS / EPERM ...).
  Status open(const Options& options) {
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = options.queue_depth * 2;
    if (options.sqpoll) {
      params.flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = options.sqpoll_idle_ms;
    }
    const int rc = io_uring_queue_init_params(options.queue_depth, &ring_, &params);
    if (rc < 0)
      return status_from_errno(-rc, fmt::format("io_uring_queue_init_params(entries = {}{})", options.queue_depth,
                                                options.sqpoll ? ", SQPOLL" : ""));
    ready_ = true;
    ext_arg_ = (params.features & IORING_FEAT_EXT_ARG) != 0;
    return Status::success();
  }

  /// io_uring_queue_exit. The kernel cancels what is still in flight and waits for it; memory those
  /// commands use must stay allocated (the Engine leaks their batches).
  void close() noexcept {
    if (ready_) io_uring_queue_exit(&ring_);
    ready_ = false;
  }

  bool ready() const noexcept { return ready_; }
  bool sqpoll_active() const noexcept { return ready_ && (ring_.flags & IORING_SETUP_SQPOLL) != 0; }
  io_uring* get() noexcept { return &ring_; }

  /// A free SQ entry, or null when the SQ is full.
  io_uring_sqe* get_sqe() noexcept { return io_uring_get_sqe(&ring_); }
  /// io_uring_submit: the number of SQEs submitted or -errno.
  int submit() noexcept { return io_uring_submit(&ring_); }

  /// Waits for a CQE for up to `ns`; consumes nothing. With IORING_FEAT_EXT_ARG the wait is
  /// io_uring_wait_cqe_timeout (no SQE needed); older kernels would need an SQE for a timed wait, so
  /// they sleep a slice of at most 50 us instead.
  void wait_for_cqe(std::uint64_t ns) {
    if (ns == 0) return;
    if (!ext_arg_) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(ns, 50'000)));
      return;
    }
    __kernel_timespec timeout{};
    timeout.tv_sec = static_cast<long long>(ns / 1'000'000'000);
    timeout.tv_nsec = static_cast<long long>(ns % 1'000'000'000);
    io_uring_cqe* cqe = nullptr;
    (void)io_uring_wait_cqe_timeout(&ring_, &cqe, &timeout);
  }

  /// Calls f(user_data, res) for every available CQE, marking each batch seen after its calls.
  /// Batches of CQEs through io_uring_peek_batch_cqe rather than the io_uring_for_each_cqe macro,
  /// whose assignment in its loop condition GCC 13 flags under -Werror=parentheses.
  template <class F>
  void for_each_cqe(F&& f) {
    std::array<io_uring_cqe*, 64> cqes{};
    while (unsigned seen = io_uring_peek_batch_cqe(&ring_, cqes.data(), cqes.size())) {
      for (unsigned i = 0; i < seen; ++i) f(io_uring_cqe_get_data(cqes[i]), cqes[i]->res);
      io_uring_cq_advance(&ring_, seen);
    }
  }

 private:
  io_uring ring_{};
  bool ready_ = false;
  bool ext_arg_ = false;  // IORING_FEAT_EXT_ARG: io_uring_wait_cqe_timeout needs no SQE
};

}  // namespace tutti::uring::detail
