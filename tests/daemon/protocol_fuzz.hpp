// The invariant the protocol fuzzer checks on every input, shared by the libFuzzer entry point
// (protocol_fuzz_main.cpp, clang only) and the corpus replay (protocol_test.cpp, every build):
// parse_request never crashes; what it accepts serializes back to a message that parses to the same request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "protocol.hpp"

namespace tutti::daemon::fuzz {

/// "" when the invariant holds, else what broke.
inline std::string run_one(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto request = parse_request(bytes);
  if (!request) {
    if (request.code() != StatusCode::INVALID_ARGUMENT) return "refused with a code other than INVALID_ARGUMENT";
    if (request.status().message().empty()) return "refused without a message";
    return "";
  }
  auto again = parse_request(to_message(*request));
  if (!again) return "to_message gave a message parse_request refuses: " + again.status().to_string();
  const Request& a = *request;
  const Request& b = *again;
  if (a.op != b.op || a.controller != b.controller || a.queues != b.queues || a.pinned_bytes != b.pinned_bytes ||
      a.lease != b.lease || a.length != b.length || a.deadline_ms != b.deadline_ms)
    return "round trip changed the request";
  return "";
}

}  // namespace tutti::daemon::fuzz
