// The OK status is Status::success() (or Status{}); the old factory name must not compile.
#include <tutti/core/status.hpp>

tutti::Status make_ok() { return tutti::Status::ok(); }
