// Shared declarations of the tutti._tutti extension (nanobind). The binding is thin: each Python
// call is one call of the C++ API (StorageRuntime, KvStore), its Status is mapped to a Python
// exception in one place (raise_status), and every wait releases the GIL. docs/python.md is the
// user's page.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>

namespace tutti::python {

namespace nb = nanobind;

/// Creates tutti.Error and one subclass per StatusCode in `m`; call once at import.
void define_errors(nb::module_& m);

/// Raises the tutti.Error subclass of `status.code()` carrying its message (`.code`, `.message`).
/// Precondition: !status.is_ok(). Never returns.
[[noreturn]] void raise_status(const Status& status);

/// The exception object for `status` (a new reference), not raised; for results that carry errors.
nb::object exception_for(const Status& status);

/// raise_status unless OK.
inline void check(const Status& status) {
  if (!status.is_ok()) raise_status(status);
}
template <class T>
T check(Result<T>&& result) {
  if (!result.is_ok()) raise_status(result.status());
  return std::move(result).value();
}

/// Seconds (Python float) to a budget in ns: negative and NaN are refused (INVALID_ARGUMENT naming
/// `field`), +inf and values past kMaxBudgetNs become kMaxBudgetNs.
std::uint64_t seconds_to_ns(double seconds, std::string_view field);

/// Waits in slices of at most kSignalSliceNs with the GIL released, and checks for signals
/// (Ctrl-C) between slices with the GIL held: `step(budget_ns)` is one bounded C++ wait that returns
/// true once finished. Returns false when `budget_ns` ran out first. A pending signal's exception
/// (KeyboardInterrupt) propagates; whatever was waited for stays in flight and can be waited again.
template <class Step>
bool wait_in_slices(std::uint64_t budget_ns, Step&& step);

inline constexpr std::uint64_t kSignalSliceNs = 50'000'000;  // 50 ms: how soon Ctrl-C is seen

void define_runtime(nb::module_& m);
void define_kv(nb::module_& m);

}  // namespace tutti::python

// ------------------------------------------------------------------------------------------------
#include <tutti/core/clock.hpp>

namespace tutti::python {

template <class Step>
bool wait_in_slices(std::uint64_t budget_ns, Step&& step) {
  const std::uint64_t deadline = deadline_after_ns(budget_ns);
  while (true) {
    const std::uint64_t left = remaining_ns(deadline);
    bool finished = false;
    {
      nb::gil_scoped_release release;
      finished = step(std::min(left, kSignalSliceNs));
    }
    if (finished) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (remaining_ns(deadline) == 0) return false;
  }
}

}  // namespace tutti::python
