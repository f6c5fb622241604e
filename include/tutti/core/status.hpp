// Status, StatusCode and Result<T>: the error vocabulary of every public Tutti entry point.
//
// A Status is a code plus a human message. Messages name the field, the offending value and the
// limit ("memory_offset = 4097 is not a multiple of the 4096-byte alignment"), so a caller can
// act on them without reading the source. OK statuses carry no message and allocate nothing.
//
// Thread-safety: Status and Result are plain values; distinct objects may be used from any
// thread, one object is not synchronised.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace tutti {

/// Outcome category of an operation. Stable numbering: values cross the daemon protocol.
enum class StatusCode : std::uint8_t {
  OK = 0,                  ///< Success.
  INVALID_ARGUMENT = 1,    ///< A field is malformed or violates a documented limit; retrying cannot help.
  OUT_OF_RANGE = 2,        ///< An offset or length reaches past the end of a memory region or target.
  NOT_FOUND = 3,           ///< A handle or named object does not exist (stale handle, missing file).
  UNSUPPORTED = 4,         ///< Valid request the backend or file system cannot serve (no FIEMAP, no O_DIRECT).
  NOT_READY = 5,           ///< The operation has not completed yet (query of in-flight IO).
  BUSY = 6,                ///< The object is in use (close or unregister while IO is in flight).
  RESOURCE_EXHAUSTED = 7,  ///< Backpressure: queue, slot or memory budget full; resubmit later.
  TIMEOUT = 8,             ///< A time budget in nanoseconds ran out.
  DEVICE_ERROR = 9,        ///< The device or kernel reported an error (NVMe status, errno).
  DATA_LOSS = 10,          ///< Bytes would be wrong or lost (hole, unwritten extent, short transfer).
  INTERNAL = 11,           ///< A broken invariant inside Tutti; a bug to report.
};

/// The upper-case name of a code, e.g. "RESOURCE_EXHAUSTED". Never null.
constexpr std::string_view to_string(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::OK: return "OK";
    case StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case StatusCode::NOT_FOUND: return "NOT_FOUND";
    case StatusCode::UNSUPPORTED: return "UNSUPPORTED";
    case StatusCode::NOT_READY: return "NOT_READY";
    case StatusCode::BUSY: return "BUSY";
    case StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case StatusCode::TIMEOUT: return "TIMEOUT";
    case StatusCode::DEVICE_ERROR: return "DEVICE_ERROR";
    case StatusCode::DATA_LOSS: return "DATA_LOSS";
    case StatusCode::INTERNAL: return "INTERNAL";
  }
  return "UNKNOWN_STATUS_CODE";
}

/// A code and a message. Default-constructed Status is OK.
class [[nodiscard]] Status {
 public:
  Status() noexcept = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  /// The OK status (no allocation); the same as Status{}.
  static Status success() noexcept { return Status(); }

  /// True for OK. The one check: `if (!status.is_ok()) return status;`.
  bool is_ok() const noexcept { return code_ == StatusCode::OK; }
  /// Deleted on purpose: `ok()` was once the static factory of the OK status, so `if (s.ok())`
  /// compiled and was always true, whatever s held. Use is_ok() to check, success() to make one.
  bool ok() const = delete;
  explicit operator bool() const noexcept { return is_ok(); }
  StatusCode code() const noexcept { return code_; }
  /// The message; empty for OK.
  const std::string& message() const noexcept { return message_; }
  /// "CODE: message", or "OK".
  std::string to_string() const {
    if (message_.empty()) return std::string(tutti::to_string(code_));
    return fmt::format("{}: {}", tutti::to_string(code_), message_);
  }
  /// Prefixes the message with context ("open file:///a: " + message); OK stays OK.
  Status with_context(std::string_view context) const {
    if (is_ok()) return *this;
    return Status(code_, fmt::format("{}: {}", context, message_));
  }

  friend bool operator==(const Status& a, StatusCode c) noexcept { return a.code_ == c; }

 private:
  StatusCode code_ = StatusCode::OK;
  std::string message_;
};

/// Builds a Status whose message is formatted with {fmt}: error(StatusCode::OUT_OF_RANGE,
/// "target_offset + length = {} exceeds the target size of {} bytes", end, size).
template <class... Args>
Status error(StatusCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

/// Either a value of type T or a non-OK Status. Constructing a Result from an OK Status is a
/// bug and yields INTERNAL, so a Result never claims success without a value.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : state_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    if (std::get<1>(state_).is_ok())
      state_.template emplace<1>(StatusCode::INTERNAL, "Result constructed from an OK status without a value");
  }

  bool is_ok() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return is_ok(); }

  /// The status: OK when a value is present.
  Status status() const { return is_ok() ? Status() : std::get<1>(state_); }
  StatusCode code() const noexcept { return is_ok() ? StatusCode::OK : std::get<1>(state_).code(); }

  /// The value. Precondition: is_ok(); otherwise std::bad_variant_access is thrown.
  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace tutti

/// Evaluates a Status expression and returns it from the enclosing function when it is not OK.
#define TUTTI_RETURN_IF_ERROR(expr)                   \
  do {                                                \
    ::tutti::Status tutti_status_ = (expr);           \
    if (!tutti_status_.is_ok()) return tutti_status_; \
  } while (0)
