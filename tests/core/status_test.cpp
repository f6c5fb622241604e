#include <doctest/doctest.h>

#include <tutti/core/status.hpp>

using tutti::Result;
using tutti::Status;
using tutti::StatusCode;

TEST_CASE("a default Status is OK and carries no message") {
  Status s;
  CHECK(s.is_ok());
  CHECK(s.code() == StatusCode::OK);
  CHECK(s.message().empty());
  CHECK(s.to_string() == "OK");
}

TEST_CASE("error() formats the message and to_string prefixes the code name") {
  Status s = tutti::error(StatusCode::OUT_OF_RANGE, "offset {} past {}", 10, 4);
  CHECK_FALSE(s.is_ok());
  CHECK(s.message() == "offset 10 past 4");
  CHECK(s.to_string() == "OUT_OF_RANGE: offset 10 past 4");
  CHECK(s.with_context("open x").message() == "open x: offset 10 past 4");
}

TEST_CASE("every status code has a distinct upper-case name") {
  for (int i = 0; i <= static_cast<int>(StatusCode::INTERNAL); ++i)
    for (int j = 0; j < i; ++j)
      CHECK(tutti::to_string(static_cast<StatusCode>(i)) != tutti::to_string(static_cast<StatusCode>(j)));
  CHECK(tutti::to_string(StatusCode::RESOURCE_EXHAUSTED) == "RESOURCE_EXHAUSTED");
}

TEST_CASE("a Result holds a value or an error, never an OK status without a value") {
  Result<int> value = 7;
  REQUIRE(value.is_ok());
  CHECK(*value == 7);
  Result<int> failed = Status(StatusCode::NOT_FOUND, "gone");
  CHECK_FALSE(failed.is_ok());
  CHECK(failed.code() == StatusCode::NOT_FOUND);
  Result<int> bogus = Status();
  CHECK_FALSE(bogus.is_ok());
  CHECK(bogus.code() == StatusCode::INTERNAL);
}
