// The tuttid protocol parser: see protocol.hpp.
#include "protocol.hpp"

#include <array>
#include <limits>
#include <span>

namespace tutti::daemon {
namespace {

using json = nlohmann::json;

constexpr std::array<std::pair<Op, std::string_view>, 8> kOps{{{Op::acquire, "acquire"},
                                                               {Op::release, "release"},
                                                               {Op::status, "status"},
                                                               {Op::devices, "devices"},
                                                               {Op::leases, "leases"},
                                                               {Op::metrics, "metrics"},
                                                               {Op::drain, "drain"},
                                                               {Op::register_memory, "register"}}};

Status bad(std::string_view key, const json& value, std::string_view expected) {
  std::string shown = value.dump(-1, ' ', true, json::error_handler_t::replace);
  if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
  return error(StatusCode::INVALID_ARGUMENT, "\"{}\": {} {}", key, shown, expected);
}

Result<std::uint64_t> get_uint(const json& message, std::string_view key, std::uint64_t min, std::uint64_t max) {
  const json& v = message[std::string(key)];
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    return bad(key, v, fmt::format("is not an integer; expected an integer in [{}, {}]", min, max));
  const auto n = v.get<std::uint64_t>();
  if (n < min || n > max) return bad(key, v, fmt::format("is out of range; expected an integer in [{}, {}]", min, max));
  return n;
}

}  // namespace

std::string_view to_string(Op op) noexcept {
  for (const auto& [o, name] : kOps)
    if (o == op) return name;
  return "unknown";
}

Result<Request> parse_request(std::string_view bytes) {
  if (bytes.size() > kMaxMessageBytes)
    return error(StatusCode::INVALID_ARGUMENT, "message of {} bytes is longer than the limit of {} bytes", bytes.size(),
                 kMaxMessageBytes);
  json message = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded()) return error(StatusCode::INVALID_ARGUMENT, "message is not valid JSON");
  if (!message.is_object())
    return error(StatusCode::INVALID_ARGUMENT, "message is a JSON {}; expected an object", message.type_name());
  if (!message.contains("tutti"))
    return error(StatusCode::INVALID_ARGUMENT,
                 "unsupported protocol version: the message has no \"tutti\" key; expected \"tutti\": {}",
                 kProtocolVersion);
  const json& version = message["tutti"];
  if (!version.is_number_unsigned() || version.get<std::uint64_t>() != kProtocolVersion)
    return error(StatusCode::INVALID_ARGUMENT, "unsupported protocol version {}; this daemon speaks \"tutti\": {}",
                 version.dump(-1, ' ', true, json::error_handler_t::replace).substr(0, 32), kProtocolVersion);
  if (!message.contains("op"))
    return error(StatusCode::INVALID_ARGUMENT, "missing key \"op\"; expected one of the ops");
  const json& op_value = message["op"];
  std::string op_list;
  for (const auto& [o, name] : kOps) op_list += fmt::format("{}{}", op_list.empty() ? "" : ", ", name);
  if (!op_value.is_string()) return bad("op", op_value, fmt::format("is not a string; expected one of: {}", op_list));
  Request request;
  bool known = false;
  for (const auto& [o, name] : kOps)
    if (op_value.get<std::string>() == name) request.op = o, known = true;
  if (!known) return bad("op", op_value, fmt::format("is not an op; expected one of: {}", op_list));

  static constexpr std::array<std::string_view, 5> kAcquireKeys{"tutti", "op", "controller", "queues", "pinned_bytes"};
  static constexpr std::array<std::string_view, 3> kReleaseKeys{"tutti", "op", "lease"};
  static constexpr std::array<std::string_view, 3> kDrainKeys{"tutti", "op", "deadline_ms"};
  static constexpr std::array<std::string_view, 4> kRegisterKeys{"tutti", "op", "lease", "length"};
  static constexpr std::array<std::string_view, 2> kPlainKeys{"tutti", "op"};
  std::span<const std::string_view> allowed = kPlainKeys;
  switch (request.op) {
    case Op::acquire: allowed = kAcquireKeys; break;
    case Op::release: allowed = kReleaseKeys; break;
    case Op::drain: allowed = kDrainKeys; break;
    case Op::register_memory: allowed = kRegisterKeys; break;
    default: break;
  }
  for (const auto& [key, value] : message.items()) {
    bool ok = false;
    for (auto k : allowed) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (auto k : allowed) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
      return error(StatusCode::INVALID_ARGUMENT, "unknown key {} for op {}; expected only: {}",
                   json(key).dump(-1, ' ', true, json::error_handler_t::replace).substr(0, 64), to_string(request.op),
                   list);
    }
  }
  switch (request.op) {
    case Op::acquire: {
      if (!message.contains("controller"))
        return error(StatusCode::INVALID_ARGUMENT, "acquire: missing key \"controller\"; expected a controller name");
      const json& c = message["controller"];
      if (!c.is_string() || c.get<std::string>().empty() || c.get<std::string>().size() > 32)
        return bad("controller", c, "is not a controller name; expected a string of 1 to 32 bytes");
      request.controller = c.get<std::string>();
      if (message.contains("queues")) {
        auto q = get_uint(message, "queues", 1, 65535);
        if (!q) return q.status();
        request.queues = static_cast<std::uint32_t>(*q);
      }
      if (message.contains("pinned_bytes")) {
        auto b = get_uint(message, "pinned_bytes", 0, 1ull << 50);
        if (!b) return b.status();
        request.pinned_bytes = *b;
      }
      break;
    }
    case Op::release: {
      if (!message.contains("lease"))
        return error(StatusCode::INVALID_ARGUMENT, "release: missing key \"lease\"; expected a lease id");
      auto id = get_uint(message, "lease", 1, std::numeric_limits<std::int64_t>::max());
      if (!id) return id.status();
      request.lease = *id;
      break;
    }
    case Op::register_memory: {
      if (!message.contains("lease"))
        return error(StatusCode::INVALID_ARGUMENT, "register: missing key \"lease\"; expected a lease id");
      auto id = get_uint(message, "lease", 1, std::numeric_limits<std::int64_t>::max());
      if (!id) return id.status();
      request.lease = *id;
      if (!message.contains("length"))
        return error(StatusCode::INVALID_ARGUMENT, "register: missing key \"length\"; expected the memfd's bytes");
      auto length = get_uint(message, "length", 4096, 1ull << 40);
      if (!length) return length.status();
      if (*length % 4096 != 0)
        return bad("length", message["length"], "is not a multiple of 4096; expected whole pages");
      request.length = *length;
      break;
    }
    case Op::drain:
      if (message.contains("deadline_ms")) {
        auto d = get_uint(message, "deadline_ms", 0, 3'600'000);
        if (!d) return d.status();
        request.deadline_ms = *d;
      }
      break;
    default: break;
  }
  return request;
}

std::string to_message(const Request& request) {
  json m{{"tutti", kProtocolVersion}, {"op", std::string(to_string(request.op))}};
  switch (request.op) {
    case Op::acquire:
      m["controller"] = request.controller;
      if (request.queues) m["queues"] = *request.queues;
      if (request.pinned_bytes) m["pinned_bytes"] = *request.pinned_bytes;
      break;
    case Op::release: m["lease"] = request.lease; break;
    case Op::register_memory:
      m["lease"] = request.lease;
      m["length"] = request.length;
      break;
    case Op::drain:
      if (request.deadline_ms) m["deadline_ms"] = *request.deadline_ms;
      break;
    default: break;
  }
  return m.dump();
}

nlohmann::json error_response(std::string_view code, std::string_view message) {
  return json{{"tutti", kProtocolVersion},
              {"ok", false},
              {"error", {{"code", std::string(code)}, {"message", std::string(message)}}}};
}

nlohmann::json ok_response() { return json{{"tutti", kProtocolVersion}, {"ok", true}}; }

nlohmann::json event_message(std::string_view name) {
  return json{{"tutti", kProtocolVersion}, {"event", std::string(name)}};
}

}  // namespace tutti::daemon
