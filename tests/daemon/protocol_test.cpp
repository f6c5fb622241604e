// The tuttid protocol parser (daemon/src/protocol.hpp): bad messages are refused with errors naming the key,
// the value and what was expected; good ones round-trip; the committed fuzz corpus keeps the invariant.
#include <doctest/doctest.h>

#include <vector>

#include "corpus_replay.hpp"
#include "protocol.hpp"
#include "protocol_fuzz.hpp"
#include "require_ok.hpp"

using tutti::StatusCode;
using tutti::daemon::Op;
using tutti::daemon::parse_request;

TEST_CASE("well-formed requests parse to what they say, and round-trip through to_message") {
  auto a = tutti::testing::require_ok(
      parse_request(R"({"tutti": 1, "op": "acquire", "controller": "soft0", "queues": 2, "pinned_bytes": 4096})"));
  CHECK(a.op == Op::acquire);
  CHECK(a.controller == "soft0");
  CHECK(a.queues == std::optional<std::uint32_t>(2));
  CHECK(a.pinned_bytes == std::optional<std::uint64_t>(4096));
  auto defaults = tutti::testing::require_ok(parse_request(R"({"op": "acquire", "controller": "x", "tutti": 1})"));
  CHECK_FALSE(defaults.queues.has_value());
  CHECK_FALSE(defaults.pinned_bytes.has_value());
  auto r = tutti::testing::require_ok(parse_request(R"({"tutti": 1, "op": "release", "lease": 7})"));
  CHECK(r.op == Op::release);
  CHECK(r.lease == 7);
  auto d = tutti::testing::require_ok(parse_request(R"({"tutti": 1, "op": "drain", "deadline_ms": 0})"));
  CHECK(d.deadline_ms == std::optional<std::uint64_t>(0));
  for (const char* op : {"status", "devices", "leases", "metrics"}) {
    auto q = tutti::testing::require_ok(parse_request(fmt::format(R"({{"tutti": 1, "op": "{}"}})", op)));
    CHECK(tutti::daemon::to_string(q.op) == op);
  }
  for (const auto& request : {a, defaults, r, d}) {
    const std::string m = tutti::daemon::to_message(request);
    CHECK(tutti::daemon::fuzz::run_one(reinterpret_cast<const std::uint8_t*>(m.data()), m.size()) == "");
  }
}

TEST_CASE("malformed requests are refused with a message naming the key, the value and what was expected") {
  struct Case {
    std::string text;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"", {"not valid JSON"}},
      {"{\"tutti\": 1, \"op\": ", {"not valid JSON"}},
      {"\xff\xfe", {"not valid JSON"}},
      {"[1, 2]", {"JSON array", "expected an object"}},
      {"\"status\"", {"JSON string", "expected an object"}},
      {R"({"op": "status"})", {"unsupported protocol version", "no \"tutti\" key"}},
      {R"({"tutti": 2, "op": "status"})", {"unsupported protocol version 2", "\"tutti\": 1"}},
      {R"({"tutti": "1", "op": "status"})", {"unsupported protocol version \"1\""}},
      {R"({"tutti": 1.0, "op": "status"})", {"unsupported protocol version"}},
      {R"({"tutti": 1})", {"missing key \"op\""}},
      {R"({"tutti": 1, "op": 3})", {"\"op\": 3", "not a string", "acquire, release"}},
      {R"({"tutti": 1, "op": "grab"})", {"\"op\": \"grab\"", "not an op", "acquire, release, status"}},
      {R"({"tutti": 1, "op": "acquire"})", {"missing key \"controller\""}},
      {R"({"tutti": 1, "op": "acquire", "controller": ""})", {"\"controller\": \"\"", "1 to 32 bytes"}},
      {R"({"tutti": 1, "op": "acquire", "controller": 5})", {"\"controller\": 5", "controller name"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "queues": 0})", {"\"queues\": 0", "[1, 65535]"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "queues": 65536})", {"\"queues\": 65536", "[1, 65535]"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "queues": -1})", {"\"queues\": -1", "not an integer"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "queues": "2"})", {"\"queues\": \"2\"", "not an integer"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "pinned_bytes": 1e30})",
       {"\"pinned_bytes\"", "not an integer"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "pinned_bytes": 1125899906842625})",
       {"\"pinned_bytes\": 1125899906842625", "out of range"}},
      {R"({"tutti": 1, "op": "acquire", "controller": "a", "lease": 1})",
       {"unknown key \"lease\" for op acquire", "controller, queues, pinned_bytes"}},
      {R"({"tutti": 1, "op": "release"})", {"missing key \"lease\""}},
      {R"({"tutti": 1, "op": "release", "lease": 0})", {"\"lease\": 0", "out of range"}},
      {R"({"tutti": 1, "op": "status", "verbose": true})", {"unknown key \"verbose\" for op status"}},
      {R"({"tutti": 1, "op": "drain", "deadline_ms": 3600001})", {"\"deadline_ms\": 3600001", "[0, 3600000]"}},
      {std::string(R"({"tutti": 1, "op": "status", "x": ")") + std::string(70000, 'a') + "\"}",
       {"longer than the limit of 65536 bytes"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text.substr(0, 80));
    auto request = parse_request(c.text);
    REQUIRE_FALSE(request.is_ok());
    CHECK(request.code() == StatusCode::INVALID_ARGUMENT);
    const std::string message = request.status().message();
    CAPTURE(message);
    for (const auto& part : c.expected) CHECK_MESSAGE(message.find(part) != std::string::npos, "missing: " << part);
  }
}

TEST_CASE("every committed protocol fuzz corpus input keeps the parser's invariant") {
  tutti::testing::replay_corpus("TUTTI_DAEMON_FUZZ_CORPUS", "tests/daemon/corpus", tutti::daemon::fuzz::run_one);
}
