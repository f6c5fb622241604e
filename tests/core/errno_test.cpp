// The one classification of errno values (tutti/core/errno.hpp), every class of docs/api.md's table,
// and the messages built from it.
#include <doctest/doctest.h>

#include <cerrno>

#include <tutti/core/errno.hpp>

using namespace tutti;

TEST_CASE("every errno class of the table maps to its status code") {
  for (int e : {ENOENT, ENOTDIR, ESTALE}) CHECK(status_code_of_errno(e) == StatusCode::NOT_FOUND);
  for (int e : {EINVAL, EBADF, EFAULT, EOVERFLOW, EISDIR, ELOOP, ENAMETOOLONG, EPERM, EACCES, EROFS, ETXTBSY})
    CHECK(status_code_of_errno(e) == StatusCode::INVALID_ARGUMENT);
  for (int e : {ENOSPC, EDQUOT, EFBIG, ENOMEM, EAGAIN, EBUSY, EMFILE, ENFILE})
    CHECK(status_code_of_errno(e) == StatusCode::RESOURCE_EXHAUSTED);
  for (int e : {EOPNOTSUPP, ENOSYS, ENOTTY}) CHECK(status_code_of_errno(e) == StatusCode::UNSUPPORTED);
  for (int e : {ENODATA, EBADMSG, EUCLEAN}) CHECK(status_code_of_errno(e) == StatusCode::DATA_LOSS);
  for (int e : {EIO, ENXIO, ENODEV, ENOMEDIUM, ETIMEDOUT, ECANCELED, EREMOTEIO, 12345})
    CHECK(status_code_of_errno(e) == StatusCode::DEVICE_ERROR);
}

TEST_CASE("status_from_errno carries the context and the errno text with its symbolic name") {
  const Status s = status_from_errno(EIO, "READ of 4096 bytes at offset 0 of '/x'");
  CHECK(s.code() == StatusCode::DEVICE_ERROR);
  CHECK(s.message() == "READ of 4096 bytes at offset 0 of '/x': Input/output error (EIO)");
  CHECK(errno_text(12345) == "Unknown error 12345");
}

TEST_CASE("open_error names the call, the path and the access asked for") {
  const Status ro = open_error("open", "/mnt/ro/kv", true, EROFS);
  CHECK(ro.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(ro.message() ==
        "open '/mnt/ro/kv' for reading and writing (OpenOptions::writable): Read-only file system (EROFS)");
  const Status missing = open_error("stat", "/nope", false, ENOENT);
  CHECK(missing.code() == StatusCode::NOT_FOUND);
  CHECK(missing.message() == "stat '/nope' for reading: No such file or directory (ENOENT)");
}
