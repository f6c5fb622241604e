// Status::ok() was once the static factory of the OK status, so `if (s.ok())` compiled and was
// always true. It is deleted: using it as a check (or as the factory) must not compile.
#include <tutti/core/status.hpp>

bool checks_with_ok(const tutti::Status& s) { return s.ok(); }
