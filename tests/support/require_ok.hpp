// require_ok(result): the value of a Result the test cannot go on without, or a failed REQUIRE
// that prints the Status (never a bare std::bad_variant_access).
#pragma once

#include <utility>

#include <doctest/doctest.h>

#include <tutti/core/status.hpp>

namespace tutti::testing {

template <class T>
T require_ok(Result<T> result) {
  REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
  return std::move(result).value();
}

}  // namespace tutti::testing
