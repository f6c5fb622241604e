// errno -> Status for the uring DataPath: one place that classifies a negative CQE result (or a
// failed io_uring syscall) into a StatusCode, with the errno text in the message.
//
// Thread-safety: pure functions.
#pragma once

#include <cerrno>
#include <string_view>

#include <fmt/format.h>

#include <tutti/bind/file.hpp>
#include <tutti/core/status.hpp>

namespace tutti::uring {

/// The StatusCode of an errno value:
///   EIO, ENXIO, ENODEV, ENOMEDIUM, ETIMEDOUT, ECANCELED, EREMOTEIO and unknown values -> DEVICE_ERROR;
///   EINVAL, EBADF, EFAULT, EOVERFLOW, EISDIR, EPERM, EACCES, EROFS, ETXTBSY       -> INVALID_ARGUMENT;
///   ENOSPC, EDQUOT, EFBIG, ENOMEM, EAGAIN, EBUSY, EMFILE, ENFILE                  -> RESOURCE_EXHAUSTED;
///   EOPNOTSUPP, ENOSYS                                                              -> UNSUPPORTED;
///   ENODATA, EBADMSG, EUCLEAN (checksum or media errors reported as lost data)     -> DATA_LOSS;
///   ENOENT, ESTALE                                                                 -> NOT_FOUND.
constexpr StatusCode status_code_of_errno(int error_number) noexcept {
  switch (error_number) {
    case EINVAL:
    case EBADF:
    case EFAULT:
    case EOVERFLOW:
    case EISDIR:
    case EPERM:
    case EACCES:
    case EROFS:
    case ETXTBSY:
      return StatusCode::INVALID_ARGUMENT;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM:
    case EAGAIN:
    case EBUSY:
    case EMFILE:
    case ENFILE:
      return StatusCode::RESOURCE_EXHAUSTED;
    case EOPNOTSUPP:
    case ENOSYS:
      return StatusCode::UNSUPPORTED;
    case ENODATA:
    case EBADMSG:
    case EUCLEAN:
      return StatusCode::DATA_LOSS;
    case ENOENT:
    case ESTALE:
      return StatusCode::NOT_FOUND;
    default:
      return StatusCode::DEVICE_ERROR;
  }
}

/// A Status for errno `error_number` (positive) with `context` and the errno text, e.g.
/// "DEVICE_ERROR: READ of 4096 bytes at offset 8192 of '/mnt/a': Input/output error (EIO)".
inline Status status_from_errno(int error_number, std::string_view context) {
  return error(status_code_of_errno(error_number), "{}: {}", context, file::errno_text(error_number));
}

}  // namespace tutti::uring
