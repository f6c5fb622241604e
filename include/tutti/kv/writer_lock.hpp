// One writer per store directory: an exclusive flock(2) on <dir>/writer.lock, held for the life of
// the writer. The holder writes its pid into the file so a refused writer can name it. The kernel
// drops the lock when the holder's process ends, even by kill -9, so a crashed writer never blocks
// the next one. (flock, not fcntl locks: LMDB's own fcntl-free robust mutexes guard the index; an
// flock belongs to the open file description, so a second open in the same process is refused too.)
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <tutti/core/status.hpp>
#include <tutti/kv/layout.hpp>

namespace tutti::kv {

class WriterLock {
 public:
  WriterLock() = default;
  WriterLock(WriterLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  WriterLock& operator=(WriterLock&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(path_, o.path_);
    return *this;
  }
  ~WriterLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }

  /// Takes the lock without waiting. Errors: BUSY naming the holder's pid when another writer
  /// holds it; the errno's code when the file cannot be opened.
  static Result<WriterLock> acquire(const std::string& dir) {
    WriterLock lock;
    lock.path_ = dir + "/writer.lock";
    lock.fd_ = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock.fd_ < 0) return errno_status(errno, fmt::format("open '{}'", lock.path_));
    if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e != EWOULDBLOCK) return errno_status(e, fmt::format("flock '{}'", lock.path_));
      char text[32] = {};
      const ssize_t n = ::pread(lock.fd_, text, sizeof text - 1, 0);
      const std::string holder = n > 0 ? std::string(text, static_cast<std::size_t>(n)) : std::string("unknown");
      return error(StatusCode::BUSY,
                   "the KV store in '{}' already has a writer: process {} holds '{}'; one writer per store (open "
                   "this one with options.read_only = true to read)",
                   dir, holder, lock.path_);
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(lock.fd_, 0) != 0 ||
        ::pwrite(lock.fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
      return errno_status(errno, fmt::format("write the pid into '{}'", lock.path_));
    return Result<WriterLock>(std::move(lock));  // explicit: nvcc does not move implicitly here
  }

  /// Removes the lock file (after a failed creation, so that nothing is left behind).
  void remove_file() {
    if (fd_ >= 0) ::unlink(path_.c_str());
  }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace tutti::kv
