// errno -> StatusCode: the one classification of errno values for every resolver and DataPath (an open
// or stat that failed, a negative io_uring CQE result, a failed io_uring, fsync or fcntl call), with the
// errno text in the message. docs/api.md has the table.
//
// Callers interpret an errno themselves only where the call gives it a meaning the table cannot know,
// and say so where they do: open(2) with O_DIRECT failing EINVAL means "this file system has no
// O_DIRECT" (UNSUPPORTED, resolve/file.hpp and resolve/local_file.hpp), FIEMAP failing EINVAL means
// "no FIEMAP" (resolve/local_file.hpp), and io_uring resubmits EINTR and EAGAIN before it classifies them.
//
// Thread-safety: pure functions (strerrordesc_np / strerrorname_np return static strings).
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <tutti/core/status.hpp>

namespace tutti {

/// The text of an errno value with its symbolic name, e.g. "Input/output error (EIO)".
inline std::string errno_text(int error_number) {
  const char* description = ::strerrordesc_np(error_number);
  const char* symbol = ::strerrorname_np(error_number);
  std::string text = description ? description : "Unknown error " + std::to_string(error_number);
  if (symbol) text.append(" (").append(symbol).append(")");
  return text;
}

/// The StatusCode of an errno value (docs/api.md, "errno values"):
///   ENOENT, ENOTDIR, ESTALE                                              -> NOT_FOUND (no such file);
///   EINVAL, EBADF, EFAULT, EOVERFLOW, EISDIR, ELOOP, ENAMETOOLONG,
///   EPERM, EACCES, EROFS, ETXTBSY                                        -> INVALID_ARGUMENT (the caller
///       asked for what the file, its permissions or its file system do not allow; retrying cannot help);
///   ENOSPC, EDQUOT, EFBIG, ENOMEM, EAGAIN, EBUSY, EMFILE, ENFILE         -> RESOURCE_EXHAUSTED;
///   EOPNOTSUPP, ENOSYS, ENOTTY                                           -> UNSUPPORTED;
///   ENODATA, EBADMSG, EUCLEAN (checksum or media errors reported as lost data) -> DATA_LOSS;
///   EIO, ENXIO, ENODEV, ENOMEDIUM, ETIMEDOUT, ECANCELED, EREMOTEIO and every other value -> DEVICE_ERROR.
constexpr StatusCode status_code_of_errno(int error_number) noexcept {
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
    case ESTALE: return StatusCode::NOT_FOUND;
    case EINVAL:
    case EBADF:
    case EFAULT:
    case EOVERFLOW:
    case EISDIR:
    case ELOOP:
    case ENAMETOOLONG:
    case EPERM:
    case EACCES:
    case EROFS:
    case ETXTBSY: return StatusCode::INVALID_ARGUMENT;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM:
    case EAGAIN:
    case EBUSY:
    case EMFILE:
    case ENFILE: return StatusCode::RESOURCE_EXHAUSTED;
    case EOPNOTSUPP:
    case ENOSYS:
    case ENOTTY: return StatusCode::UNSUPPORTED;
    case ENODATA:
    case EBADMSG:
    case EUCLEAN: return StatusCode::DATA_LOSS;
    default: return StatusCode::DEVICE_ERROR;
  }
}

/// A Status for errno `error_number` (positive) with `context` and the errno text, e.g.
/// "DEVICE_ERROR: READ of 4096 bytes at offset 8192 of '/mnt/a': Input/output error (EIO)".
inline Status status_from_errno(int error_number, std::string_view context) {
  return error(status_code_of_errno(error_number), "{}: {}", context, errno_text(error_number));
}

/// The Status of a failed `call` (open, stat, fstat ...) on `path` while a resolver opens a file, for
/// reading or (`writable`) reading and writing: status_code_of_errno's code, and a message naming the
/// call, the path, the access asked for and the errno text, e.g.
/// "INVALID_ARGUMENT: open '/mnt/ro/kv' for reading and writing (OpenOptions::writable): Read-only file
/// system (EROFS)".
inline Status open_error(std::string_view call, std::string_view path, bool writable, int error_number) {
  return error(status_code_of_errno(error_number), "{} '{}' for {}: {}", call, path,
               writable ? "reading and writing (OpenOptions::writable)" : "reading", errno_text(error_number));
}

}  // namespace tutti
