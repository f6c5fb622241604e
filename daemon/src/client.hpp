// A connection to tuttid (the client side of protocol.hpp): tuttictl and the tests use it; a runtime resource
// that leases queues will too. Thread-safety: one thread per Connection.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tutti/core/status.hpp>

namespace tutti::daemon {

class Connection {
 public:
  /// The longest connect() or send() waits for the daemon (SO_SNDTIMEO), in ns.
  static constexpr std::uint64_t kSendTimeoutNs = 10'000'000'000;

  /// Connects to the daemon's socket. Errors: NOT_FOUND (no socket, or nothing listening: errno text),
  /// UNSUPPORTED (permission denied on the socket: not in its group), TIMEOUT (not accepted within
  /// kSendTimeoutNs: the daemon's backlog is full).
  static Result<Connection> connect(const std::string& socket_path);

  Connection(Connection&& other) noexcept;
  Connection& operator=(Connection&& other) noexcept;
  ~Connection();

  /// Sends one message, with `fds` attached (SCM_RIGHTS; the caller keeps its copies). Errors: DEVICE_ERROR
  /// (the daemon closed the connection), INVALID_ARGUMENT (too long), TIMEOUT (not taken within
  /// kSendTimeoutNs: the daemon is not reading).
  Status send(const nlohmann::json& message, const std::vector<int>& fds = {});
  /// Sends a request and returns its response (events that arrive first are kept for next_event).
  /// Errors: those of send, TIMEOUT (no response within timeout_ns), DEVICE_ERROR ("connection closed by
  /// tuttid": the daemon stopped or crashed; its leases are revoked).
  Result<nlohmann::json> call(const nlohmann::json& request, std::uint64_t timeout_ns);
  /// As call, with `fds` sent along and the file descriptors that came with the response in `received`
  /// (the caller owns and closes them).
  Result<nlohmann::json> call(const nlohmann::json& request, std::uint64_t timeout_ns, const std::vector<int>& fds,
                              std::vector<int>& received);
  /// The next event ({"event": ...}) within timeout_ns. Errors: TIMEOUT, DEVICE_ERROR (closed).
  Result<nlohmann::json> next_event(std::uint64_t timeout_ns);
  int fd() const noexcept { return fd_; }

 private:
  explicit Connection(int fd) : fd_(fd) {}
  Result<nlohmann::json> receive(std::uint64_t deadline_ns, std::vector<int>* fds);
  int fd_ = -1;
  std::deque<nlohmann::json> events_;
};

}  // namespace tutti::daemon
