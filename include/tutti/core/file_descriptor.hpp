// An owned POSIX file descriptor: the one RAII wrapper every resolver and DataPath uses.
#pragma once

#include <unistd.h>

#include <utility>

namespace tutti {

/// An owned file descriptor: closed on destruction, move-only. -1 means "none".
/// Thread-safety: a plain value; one object is not synchronised.
class FileDescriptor {
 public:
  FileDescriptor() noexcept = default;
  /// Takes ownership of `fd` (a descriptor from open(2), or -1).
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  /// The descriptor, or -1.
  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  /// Closes the descriptor (close(2) errors are ignored: the descriptor is released either way).
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace tutti
