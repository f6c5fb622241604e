// The client side of the tuttid protocol: see client.hpp.
#include "client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <tutti/core/clock.hpp>

#include "protocol.hpp"

namespace tutti::daemon {

Result<Connection> Connection::connect(const std::string& socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(address.sun_path))
    return error(StatusCode::INVALID_ARGUMENT, "socket path {} is longer than {} bytes", socket_path,
                 sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return error(StatusCode::DEVICE_ERROR, "socket: {}", std::strerror(errno));
  // Bounds connect (a full listen backlog) and every sendmsg (a daemon that stopped reading): for a
  // Unix socket both wait at most SO_SNDTIMEO, then fail with EAGAIN.
  const timeval send_timeout{static_cast<time_t>(kSendTimeoutNs / 1'000'000'000), 0};
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout) != 0) {
    const int e = errno;
    ::close(fd);
    return error(StatusCode::DEVICE_ERROR, "setsockopt(SO_SNDTIMEO): {}", std::strerror(e));
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    const int e = errno;
    ::close(fd);
    if (e == EAGAIN)
      return error(StatusCode::TIMEOUT, "connect to tuttid at {}: not accepted within {} s (its backlog is full)",
                   socket_path, kSendTimeoutNs / 1'000'000'000);
    return error(e == EACCES || e == EPERM ? StatusCode::UNSUPPORTED : StatusCode::NOT_FOUND,
                 "connect to tuttid at {}: {}{}", socket_path, std::strerror(e),
                 e == EACCES ? " (the socket is mode 0660: the user must be in its group)" : "");
  }
  return Connection(fd);
}

Connection::Connection(Connection&& other) noexcept : fd_(other.fd_), events_(std::move(other.events_)) {
  other.fd_ = -1;
}
Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    events_ = std::move(other.events_);
    other.fd_ = -1;
  }
  return *this;
}
Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

Status Connection::send(const nlohmann::json& message, const std::vector<int>& fds) {
  std::string text = message.dump();
  if (text.size() > kMaxMessageBytes)
    return error(StatusCode::INVALID_ARGUMENT, "message of {} bytes is above {} bytes", text.size(), kMaxMessageBytes);
  if (fds.size() > kMaxFds) return error(StatusCode::INVALID_ARGUMENT, "{} fds: at most {}", fds.size(), kMaxFds);
  iovec io{text.data(), text.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty()) {
    header.msg_control = control;
    header.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (::sendmsg(fd_, &header, MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    const int e = errno;
    if (e == EAGAIN)
      return error(StatusCode::TIMEOUT, "send to tuttid: not taken within {} s (the daemon is not reading)",
                   kSendTimeoutNs / 1'000'000'000);
    return error(StatusCode::DEVICE_ERROR, "send to tuttid: {}", std::strerror(e));
  }
  return Status::success();
}

Result<nlohmann::json> Connection::receive(std::uint64_t deadline_ns, std::vector<int>* fds) {
  std::vector<char> buffer(kMaxMessageBytes + 1);
  for (;;) {
    const std::uint64_t left = remaining_ns(deadline_ns);
    if (left == 0) return error(StatusCode::TIMEOUT, "no message from tuttid within the time budget");
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<std::uint64_t>(left / 1'000'000 + 1, 60'000)));
    if (ready < 0 && errno != EINTR) return error(StatusCode::DEVICE_ERROR, "poll: {}", std::strerror(errno));
    if (ready <= 0) continue;
    iovec io{buffer.data(), buffer.size()};
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_, &header, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds != nullptr)
          fds->push_back(received);
        else
          ::close(received);
      }
    }
    if (n < 0) return error(StatusCode::DEVICE_ERROR, "receive from tuttid: {}", std::strerror(errno));
    if (n == 0)
      return error(StatusCode::DEVICE_ERROR, "connection closed by tuttid (it stopped or crashed): leases revoked");
    auto message = nlohmann::json::parse(buffer.data(), buffer.data() + n, nullptr, false);
    if (message.is_discarded() || !message.is_object())
      return error(StatusCode::DEVICE_ERROR, "tuttid sent a message that is not a JSON object");
    return message;
  }
}

Result<nlohmann::json> Connection::call(const nlohmann::json& request, std::uint64_t timeout_ns) {
  std::vector<int> received;
  auto response = call(request, timeout_ns, {}, received);
  for (int fd : received) ::close(fd);
  return response;
}

Result<nlohmann::json> Connection::call(const nlohmann::json& request, std::uint64_t timeout_ns,
                                        const std::vector<int>& fds, std::vector<int>& received) {
  TUTTI_RETURN_IF_ERROR(send(request, fds));
  const std::uint64_t deadline = deadline_after_ns(timeout_ns);
  for (;;) {
    auto message = receive(deadline, &received);
    if (!message) return message;
    if (message->contains("event")) {
      events_.push_back(std::move(message.value()));
      continue;
    }
    return message;
  }
}

Result<nlohmann::json> Connection::next_event(std::uint64_t timeout_ns) {
  if (!events_.empty()) {
    auto event = std::move(events_.front());
    events_.pop_front();
    return event;
  }
  auto message = receive(deadline_after_ns(timeout_ns), nullptr);
  if (!message) return message;
  if (!message->contains("event"))
    return error(StatusCode::INTERNAL, "tuttid sent a response nobody asked for: {}", message->dump());
  return message;
}

}  // namespace tutti::daemon
