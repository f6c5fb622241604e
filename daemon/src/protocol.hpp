// The tuttid protocol: versioned JSON messages, one per SOCK_SEQPACKET packet on a Unix domain socket
// (docs/daemon.md, "Protocol"). Every message carries "tutti": kProtocolVersion. Requests go from client to
// daemon and get exactly one response ({"ok": true, ...} or {"ok": false, "error": {"code", "message"}});
// events ({"event": ...}) go from daemon to client unasked, on the connection of the lease they concern.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <tutti/core/status.hpp>

namespace tutti::daemon {

/// The version this build speaks; a message of another version is refused with unsupported_version.
inline constexpr std::uint32_t kProtocolVersion = 1;
/// Largest message, bytes (one packet). Longer packets are truncated by the kernel and refused.
inline constexpr std::size_t kMaxMessageBytes = 64 * 1024;
/// Most file descriptors one message carries (SCM_RIGHTS): BAR0, then an SQ and a CQ per leased queue.
inline constexpr std::size_t kMaxFds = 1 + 2 * 64;
/// Runs of bus pages ([address, pages], at most 2 x 20 decimal digits and punctuation each) one `register`
/// answer carries, well inside kMaxMessageBytes.
inline constexpr std::size_t kMaxRegisterRuns = 1024;

enum class Op : std::uint8_t { acquire, release, status, devices, leases, metrics, drain, register_memory };

std::string_view to_string(Op op) noexcept;

/// A request, as parsed. Fields that an op does not take are left at their defaults.
struct Request {
  Op op = Op::status;
  std::string controller;                     ///< acquire: controller name (required)
  std::optional<std::uint32_t> queues;        ///< acquire: queue pairs, 1..65535 (default: the controller's)
  std::optional<std::uint64_t> pinned_bytes;  ///< acquire: bytes the client may pin (default: the controller's)
  std::uint64_t lease = 0;                    ///< release, register: lease id (required, >= 1)
  std::uint64_t length = 0;                   ///< register: bytes of the memfd sent with it, a multiple of 4096
  std::optional<std::uint64_t> deadline_ms;   ///< drain: how long holders get before revocation
};

/// Error codes of responses ("error": {"code": ...}).
namespace errors {
inline constexpr std::string_view kBadRequest = "bad_request";                  ///< the message does not parse
inline constexpr std::string_view kUnsupportedVersion = "unsupported_version";  ///< "tutti" is not ours
inline constexpr std::string_view kPermissionDenied = "permission_denied";      ///< not on the allow list
inline constexpr std::string_view kOverLimit = "over_limit";                    ///< above a per-client maximum
inline constexpr std::string_view kExhausted = "exhausted";                     ///< no free queue on the controller
inline constexpr std::string_view kNotFound = "not_found";                      ///< no such controller or lease
inline constexpr std::string_view kUnavailable = "unavailable";                 ///< controller not up
inline constexpr std::string_view kDraining = "draining";                       ///< drain or SIGTERM: no new leases
inline constexpr std::string_view kInternal = "internal";
}  // namespace errors

/// Parses one request. Errors (INVALID_ARGUMENT, message naming the key, the value and what was expected):
/// not JSON, not an object, longer than kMaxMessageBytes, "tutti" missing or not kProtocolVersion (the message
/// then starts with "unsupported protocol version"), unknown "op", missing or out-of-range fields, unknown keys.
Result<Request> parse_request(std::string_view bytes);

/// The request as a message (parse_request(to_message(r)) gives r back).
std::string to_message(const Request& request);

/// {"tutti": 1, "ok": false, "error": {"code": code, "message": message}}
nlohmann::json error_response(std::string_view code, std::string_view message);
/// {"tutti": 1, "ok": true}
nlohmann::json ok_response();
/// {"tutti": 1, "event": name}
nlohmann::json event_message(std::string_view name);

}  // namespace tutti::daemon
