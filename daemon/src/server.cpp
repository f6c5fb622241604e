// tuttid's server: see server.hpp and docs/daemon.md.
#include "server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tutti/core/clock.hpp>
#include <tutti/core/counted.hpp>

#include "controllers.hpp"
#include "protocol.hpp"

namespace tutti::daemon {
namespace {

using json = nlohmann::json;

/// Connections served at once; more are closed at accept.
constexpr std::size_t kMaxConnections = 1024;
/// Queue pairs of one lease: their SQ and CQ memfds travel in one message (kMaxFds).
constexpr std::uint32_t kMaxQueuesPerLease = (kMaxFds - 1) / 2;

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5 (asm-generic/socket.h); older headers lack it
#endif

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

/// The start time of process `pid` (field 22 of /proc/<pid>/stat, clock ticks since boot); 0 when unknown.
std::uint64_t start_time(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto name_end = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (name_end == std::string::npos) return 0;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)  // fields 3 (state) .. 22 (starttime)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

/// A pidfd of the process at the other end of accepted socket `fd` (`pid`: its SO_PEERCRED pid), or -1.
/// SO_PEERPIDFD (Linux 6.5) names the process that connected, whatever became of its pid since. Before 6.5
/// (ENOPROTOOPT) pidfd_open(pid) names the process that has the pid now: it is taken only when that process's
/// start time read before and after it is the same and it has not exited meanwhile, which shows it is the
/// one that had the pid right after the accept. A peer that exited before the accept and whose pid was reused
/// by then is taken for the new process (docs/daemon.md, "Protocol"). EINVAL or ESRCH from SO_PEERPIDFD:
/// the peer has exited and been reaped, so pidfd_open could only find a later process: none.
int peer_pidfd(int fd, pid_t pid) {
  int pidfd = -1;
  socklen_t length = sizeof pidfd;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &length) == 0) return pidfd;
  if (errno != ENOPROTOOPT) return -1;
  const std::uint64_t before = start_time(pid);
  if (before == 0) return -1;
  pidfd = pidfd_open(pid);
  if (pidfd < 0) return -1;
  pollfd exited{pidfd, POLLIN, 0};
  if (start_time(pid) != before || ::poll(&exited, 1, 0) != 0) {
    ::close(pidfd);
    return -1;
  }
  return pidfd;
}

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // SO_PEERGROUPS: the supplementary groups
};

struct Client {
  int fd = -1;
  int pidfd = -1;  // of the peer process, opened at accept
  Peer peer;
};

/// A client buffer registered on a lease: the daemon's mapping of the client's memfd, DMA-mapped.
struct Registered {
  std::uint64_t mapping_id = 0;
  void* address = nullptr;
  std::size_t length = 0;
};

struct Lease {
  std::vector<Registered> registered;
  std::uint64_t registered_bytes = 0;
  std::uint64_t id = 0;
  Peer peer;
  std::size_t controller = 0;
  std::vector<std::uint16_t> qids;
  std::uint64_t pinned_bytes = 0;
  std::uint64_t granted_ns = 0;
  int pidfd = -1;               // the holder's pidfd (a dup per lease)
  int client_fd = -1;           // the connection it was granted on; -1 once that closed
  std::optional<PciLease> pci;  // a PCI controller's lease: tuttid's copy of the sealed file sent to the client
};

struct Metrics {
  std::uint64_t granted = 0, released = 0, reclaimed = 0, revoked = 0;
  std::map<std::string, std::uint64_t> refused;  // by error code
  std::uint64_t bad_requests = 0;
  double grant_seconds_sum = 0, reclaim_seconds_last = 0, reclaim_seconds_max = 0;
  std::uint64_t revoked_at_restart = 0;
};

class Server {
 public:
  Server(const Config& config, std::FILE* log) : config_(config), log_(log) {}
  ~Server();
  Status start();
  Status loop();

 private:
  template <class... Args>
  void say(fmt::format_string<Args...> format, Args&&... args) {
    fmt::print(log_, "tuttid: {}\n", fmt::format(format, std::forward<Args>(args)...));
    std::fflush(log_);
  }
  Status adopt_or_revoke_previous_state();
  Status write_state();
  Status open_socket();
  void accept_client();
  void handle_message(Client& client);
  void close_client(int fd);
  json handle(const Request& request, Client& client, const std::vector<int>& fds, std::vector<int>& out_fds);
  json acquire(const Request& request, Client& client, std::vector<int>& out_fds);
  json register_memory(const Request& request, Client& client, const std::vector<int>& fds);
  json release(const Request& request, Client& client);
  json status_json() const;
  json devices_json() const;
  json leases_json() const;
  std::string metrics_text() const;
  void start_drain(std::uint64_t deadline_ms, std::string_view why);
  void controller_reset(std::size_t controller, bool lost);
  void end_lease(std::uint64_t id, std::string_view how, std::string_view reason);
  void send(int fd, const json& message, const std::vector<int>& fds = {});
  bool allowed(const ControllerConfig& c, const Peer& peer) const;

  const Config& config_;
  std::FILE* log_;
  std::vector<std::unique_ptr<ControllerSlot>> controllers_;
  std::map<int, Client> clients_;
  std::map<std::uint64_t, Lease> leases_;
  std::uint64_t next_lease_ = 1;
  int listen_fd_ = -1, signal_fd_ = -1;
  /// A descriptor held in reserve (/dev/null): when accept fails with EMFILE or ENFILE, it is closed
  /// to accept and close the waiting connection, then taken again. Without it the pending
  /// connection keeps the listening socket readable and poll() returns at once, forever.
  int spare_fd_ = -1;
  bool draining_ = false, stopping_ = false;
  std::uint64_t drain_deadline_ns_ = 0;
  std::string drain_reason_;
  std::uint64_t started_ns_ = monotonic_ns();
  Metrics metrics_;
  json previous_leases_ = json::array();  // revoked at restart: reported by status
};

Server::~Server() {
  for (auto& [fd, client] : clients_) {
    ::close(fd);
    if (client.pidfd >= 0) ::close(client.pidfd);
  }
  for (auto& [id, lease] : leases_)
    if (lease.pidfd >= 0) ::close(lease.pidfd);
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(config_.socket_path.c_str());
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

// Restart policy (docs/daemon.md, "Restart"): revoke all and tell. A soft controller lives in the daemon's
// process, so its queues died with the previous daemon; holders learned it from their socket (EOF). The state
// file names the leases the previous daemon had granted: they are reported as revoked (status, metrics), and
// lease ids continue after them, so a stale id is refused with a message that says what happened to it.
Status Server::adopt_or_revoke_previous_state() {
  std::ifstream in(config_.state_path);
  if (!in) return Status::success();
  json state = json::parse(in, nullptr, false);
  if (state.is_discarded() || !state.is_object() || !state.contains("leases") || !state["leases"].is_array()) {
    say("state file {} is not a tuttid state file: ignored", config_.state_path);
    return Status::success();
  }
  if (state.contains("next_lease") && state["next_lease"].is_number_unsigned())
    next_lease_ = std::max<std::uint64_t>(next_lease_, state["next_lease"].get<std::uint64_t>());
  for (auto& lease : state["leases"]) {
    if (!lease.is_object()) continue;
    const bool alive = lease.contains("pid") && lease["pid"].is_number_integer() &&
                       ::kill(static_cast<pid_t>(lease["pid"].get<std::int64_t>()), 0) == 0;
    lease["client_alive"] = alive;
    say("restart: lease {} of pid {} on {} revoked (the previous tuttid stopped without releasing it; client {})",
        lease.value("id", 0), lease.value("pid", 0), lease.value("controller", ""), alive ? "alive" : "dead");
    previous_leases_.push_back(lease);
    ++metrics_.revoked_at_restart;
  }
  return Status::success();
}

Status Server::write_state() {
  json state{{"tutti_state", 1}, {"daemon_pid", ::getpid()}, {"next_lease", next_lease_}, {"leases", json::array()}};
  for (const auto& [id, lease] : leases_)
    state["leases"].push_back({{"id", id},
                               {"pid", lease.peer.pid},
                               {"uid", lease.peer.uid},
                               {"controller", controllers_[lease.controller]->config().name},
                               {"queues", lease.qids},
                               {"pinned_bytes", lease.pinned_bytes}});
  const std::string temporary = config_.state_path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << state.dump(1) << '\n';
    if (!out) return error(StatusCode::DEVICE_ERROR, "state file {}: cannot be written", temporary);
  }
  if (std::rename(temporary.c_str(), config_.state_path.c_str()) != 0)
    return error(StatusCode::DEVICE_ERROR, "state file {}: rename: {}", config_.state_path, std::strerror(errno));
  return Status::success();
}

Status Server::open_socket() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(config_.socket_path).parent_path(), ec);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, config_.socket_path.c_str(), config_.socket_path.size() + 1);
  // A socket left by a daemon that died is removed; one another daemon listens on is not.
  struct stat st {};
  if (::lstat(config_.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return error(StatusCode::INVALID_ARGUMENT, "socket.path {} exists and is not a socket", config_.socket_path);
    const int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(probe);
    if (live) return error(StatusCode::BUSY, "another tuttid listens on {}", config_.socket_path);
    ::unlink(config_.socket_path.c_str());
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return error(StatusCode::DEVICE_ERROR, "socket: {}", std::strerror(errno));
  // The socket is created with no permission for anyone but the owner, then opened to its group: no window
  // in which others could connect.
  const mode_t old_mask = ::umask(0177);
  const int bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address);
  ::umask(old_mask);
  if (bound != 0) return error(StatusCode::DEVICE_ERROR, "bind {}: {}", config_.socket_path, std::strerror(errno));
  if (config_.socket_gid && ::chown(config_.socket_path.c_str(), static_cast<uid_t>(-1), *config_.socket_gid) != 0)
    return error(StatusCode::DEVICE_ERROR, "chown {} to group {}: {}", config_.socket_path, config_.socket_group_name,
                 std::strerror(errno));
  if (::chmod(config_.socket_path.c_str(), config_.socket_mode) != 0)
    return error(StatusCode::DEVICE_ERROR, "chmod {}: {}", config_.socket_path, std::strerror(errno));
  if (::listen(listen_fd_, 64) != 0) return error(StatusCode::DEVICE_ERROR, "listen: {}", std::strerror(errno));
  return Status::success();
}

Status Server::start() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  if (::sigprocmask(SIG_BLOCK, &signals, nullptr) != 0)
    return error(StatusCode::INTERNAL, "sigprocmask: {}", std::strerror(errno));
  signal_fd_ = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) return error(StatusCode::INTERNAL, "signalfd: {}", std::strerror(errno));
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (spare_fd_ < 0)
    return error(StatusCode::INTERNAL, "open /dev/null (the spare descriptor): {}", std::strerror(errno));
  // The socket first: a second tuttid stops here, before it touches the state file or a controller the
  // running one owns (its bring-up would adopt them, and its stop would unbind them).
  TUTTI_RETURN_IF_ERROR(open_socket());
  TUTTI_RETURN_IF_ERROR(adopt_or_revoke_previous_state());
  // Bring-up, in the configured order. A controller that fails stays listed (state failed, its error):
  // leases on it are refused with "unavailable", the others serve.
  for (const auto& c : config_.controllers) {
    controllers_.push_back(std::make_unique<ControllerSlot>(c));
    const std::uint64_t t0 = monotonic_ns();
    Status s = controllers_.back()->bring_up();
    for (const auto& step : controllers_.back()->bring_up_steps()) say("controller {}: {}", c.name, step);
    // The namespaces' file systems, mounted or verified (mounts.hpp), the same for every kind of controller.
    if (s.is_ok()) s = controllers_.back()->mount_namespaces(controllers_.size() - 1);
    if (s.is_ok()) {
      say("controller {} up in {} ms ({} leasable queue pairs of depth {}, kernel queues {})", c.name,
          (monotonic_ns() - t0) / 1'000'000, c.leasable_queues(), c.queue_depth, c.kernel_queues);
      for (const auto& n : controllers_.back()->namespaces_json())
        if (n.contains("mount_state"))
          say("controller {} namespace {}: {} on {} ({}, {})", c.name, n["nsid"].get<std::uint32_t>(),
              n["block_device"].get<std::string>(), n["mount"].get<std::string>(), n["filesystem"].get<std::string>(),
              n["mount_state"].get<std::string>());
    } else
      say("controller {} failed: {}", c.name, s.to_string());
  }
  TUTTI_RETURN_IF_ERROR(write_state());
  say("listening on {} (pid {})", config_.socket_path, ::getpid());
  return Status::success();
}

void Server::send(int fd, const json& message, const std::vector<int>& fds) {
  if (fd < 0) return;
  std::string text = message.dump(-1, ' ', false, json::error_handler_t::replace);
  iovec io{text.data(), text.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty() && fds.size() <= kMaxFds) {
    header.msg_control = control;
    header.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  // Non-blocking: a client that does not read its socket loses messages, it never stalls the daemon.
  (void)::sendmsg(fd, &header, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Server::accept_client() {
  if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // a failed reopen is retried here
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int accept_errno = errno;
      if ((accept_errno == EMFILE || accept_errno == ENFILE) && spare_fd_ >= 0) {
        // Out of descriptors: refuse the waiting connection with the spare one (see spare_fd_).
        ::close(spare_fd_);
        const int refused = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (refused >= 0) ::close(refused);
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        say("refused a connection: out of file descriptors ({})", accept_errno == ENFILE ? "ENFILE" : "EMFILE");
        if (refused >= 0) continue;
      }
      return;
    }
    if (clients_.size() >= kMaxConnections) {  // a member of the socket's group cannot exhaust the daemon's fds
      say("refused a connection: {} connections open (the limit)", clients_.size());
      ::close(fd);
      continue;
    }
    Client client;
    client.fd = fd;
    ucred credentials{};
    socklen_t length = sizeof credentials;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
      ::close(fd);
      continue;
    }
    client.peer = {credentials.pid, credentials.uid, credentials.gid, {}};
    // SO_PEERGROUPS fails with ERANGE and sets the length it needs when the buffer is short (more
    // than 256 supplementary groups, up to NGROUPS_MAX 65536): ask again with that size.
    std::vector<gid_t> groups(256);
    socklen_t groups_length = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    int got = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &groups_length);
    if (got != 0 && errno == ERANGE && groups_length > groups.size() * sizeof(gid_t)) {
      groups.resize(groups_length / sizeof(gid_t));
      groups_length = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
      got = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &groups_length);
    }
    if (got == 0) {
      groups.resize(groups_length / sizeof(gid_t));
      client.peer.groups = groups;
    }
    // The pidfd of the process that connected (peer_pidfd: exact with SO_PEERPIDFD; before Linux 6.5 that of
    // the process with its pid now, rechecked); -1 when there is none, and acquire is refused.
    client.pidfd = peer_pidfd(fd, credentials.pid);
    clients_[fd] = client;
  }
}

void Server::close_client(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  for (auto& [id, lease] : leases_)
    if (lease.client_fd == fd) lease.client_fd = -1;  // the lease lives on, tied to the process (pidfd)
  if (it->second.pidfd >= 0) ::close(it->second.pidfd);
  ::close(fd);
  clients_.erase(it);
}

bool Server::allowed(const ControllerConfig& c, const Peer& peer) const {
  if (peer.uid == 0) return true;  // root can open the device itself: an allow list cannot keep it out
  if (std::find(c.allowed_uids.begin(), c.allowed_uids.end(), peer.uid) != c.allowed_uids.end()) return true;
  if (std::find(c.allowed_gids.begin(), c.allowed_gids.end(), peer.gid) != c.allowed_gids.end()) return true;
  for (gid_t g : peer.groups)
    if (std::find(c.allowed_gids.begin(), c.allowed_gids.end(), g) != c.allowed_gids.end()) return true;
  return false;
}

json Server::acquire(const Request& request, Client& client, std::vector<int>& out_fds) {
  const std::uint64_t t0 = monotonic_ns();
  auto refuse = [this](std::string_view code, std::string message) {
    ++metrics_.refused[std::string(code)];
    say("refused: {}", message);
    return error_response(code, message);
  };
  if (draining_)
    return refuse(errors::kDraining,
                  fmt::format("acquire {}: tuttid is draining ({}): no new leases", request.controller, drain_reason_));
  std::size_t index = controllers_.size();
  for (std::size_t i = 0; i < controllers_.size(); ++i)
    if (controllers_[i]->config().name == request.controller) index = i;
  if (index == controllers_.size())
    return refuse(errors::kNotFound, fmt::format("acquire: no controller named \"{}\"", request.controller));
  ControllerSlot& slot = *controllers_[index];
  const ControllerConfig& c = slot.config();
  if (!allowed(c, client.peer))
    return refuse(errors::kPermissionDenied,
                  fmt::format("acquire {}: uid {} (gid {}) of pid {} is not on the allow list of controller {} "
                              "(allow.users, allow.groups in the tuttid configuration)",
                              c.name, client.peer.uid, client.peer.gid, client.peer.pid, c.name));
  if (client.pidfd < 0)
    return refuse(errors::kInternal, fmt::format("acquire {}: no pidfd of pid {} (it exited before tuttid accepted "
                                                 "its connection, or pidfd_open failed): the lease could not be "
                                                 "reclaimed when the client dies",
                                                 c.name, client.peer.pid));
  const std::uint32_t queues = request.queues.value_or(c.client.default_queues);
  if (queues > kMaxQueuesPerLease)
    return refuse(errors::kOverLimit, fmt::format("acquire {}: {} queues in one lease; at most {} (ask again for more)",
                                                  c.name, queues, kMaxQueuesPerLease));
  const std::uint64_t pinned = request.pinned_bytes.value_or(c.client.default_pinned_bytes);
  std::uint64_t held_queues = 0, held_pinned = 0;
  for (const auto& [id, lease] : leases_)
    if (lease.peer.pid == client.peer.pid && lease.controller == index)
      held_queues += lease.qids.size(), held_pinned += lease.pinned_bytes;
  if (held_queues + queues > c.client.max_queues)
    return refuse(
        errors::kOverLimit,
        fmt::format("acquire {}: {} for pid {} (which holds {}) is above client.max_queues {} of "
                    "controller {}",
                    c.name, counted(queues, "queue"), client.peer.pid, held_queues, c.client.max_queues, c.name));
  if (held_pinned + pinned > c.client.max_pinned_bytes)
    return refuse(errors::kOverLimit,
                  fmt::format("acquire {}: pinned_bytes {} for pid {} (which holds {}) is above "
                              "client.max_pinned_bytes {} of controller {}",
                              c.name, pinned, client.peer.pid, held_pinned, c.client.max_pinned_bytes, c.name));
  (void)slot.recheck_mounts();  // a mount swapped since bring-up fails the controller: refused below
  if (slot.state() != BringUpState::up)
    return refuse(errors::kUnavailable,
                  fmt::format("acquire {}: controller is {}: {}", c.name, to_string(slot.state()), slot.last_error()));
  if (queues > slot.queues_free())
    return refuse(errors::kExhausted, fmt::format("acquire {}: {} asked, {} of {} leasable queues free", c.name,
                                                  counted(queues, "queue"), slot.queues_free(), c.leasable_queues()));
  // The lease's own pidfd: without one the client's death would go unnoticed and its queues never return.
  const int pidfd = ::fcntl(client.pidfd, F_DUPFD_CLOEXEC, 0);
  if (pidfd < 0)
    return refuse(errors::kInternal, fmt::format("acquire {}: duplicating the pidfd of pid {} failed ({}): the lease "
                                                 "could not be watched",
                                                 c.name, client.peer.pid, std::strerror(errno)));
  std::optional<PciLease> pci;
  Result<std::vector<std::uint16_t>> qids = std::vector<std::uint16_t>{};
  if (slot.is_pci()) {
    auto opened = slot.open_pci_lease(queues, pinned);
    if (opened)
      pci = std::move(opened.value()), qids = pci->qids();
    else
      qids = opened.status();
  } else {
    qids = slot.create_queues(queues);
  }
  if (!qids) {
    ::close(pidfd);
    // Fewer free queues in the driver than tuttid counts (queue groups of files tuttid does not hold): a
    // resource refusal whose message names the controller, the queues asked and the queues free.
    return refuse(qids.status() == StatusCode::RESOURCE_EXHAUSTED ? errors::kExhausted : errors::kInternal,
                  qids.status().to_string());
  }
  Lease lease;
  lease.id = next_lease_++;
  lease.peer = client.peer;
  lease.controller = index;
  lease.qids = *qids;
  lease.pinned_bytes = pinned;
  lease.granted_ns = monotonic_ns();
  lease.pidfd = pidfd;
  lease.client_fd = client.fd;
  lease.pci = pci;
  leases_[lease.id] = lease;
  Status persisted = write_state();
  if (!persisted.is_ok()) say("{}", persisted.to_string());
  ++metrics_.granted;
  metrics_.grant_seconds_sum += static_cast<double>(monotonic_ns() - t0) * 1e-9;
  say("lease {} granted: pid {} uid {} on {}, queues {}, pinned_bytes {}", lease.id, lease.peer.pid, lease.peer.uid,
      c.name, fmt::join(lease.qids, ","), pinned);
  json response = ok_response();
  response["lease"] = {{"id", lease.id},
                       {"controller", c.name},
                       {"queues", lease.qids},
                       {"queue_depth", c.queue_depth},
                       {"pinned_bytes", pinned},
                       {"lba_size", slot.lba_size()},
                       {"namespace_size_lbas", slot.namespace_size_lbas()},
                       {"accelerators", c.accelerators},
                       {"namespaces", slot.namespaces_json()}};
  // What a client needs to drive the queues as a controller of its own (LeasedController's identity).
  if (const nvme::ControllerIdentity* id = slot.identity()) {
    response["lease"]["nsid"] = id->nsid;
    response["lease"]["max_data_transfer_bytes"] = id->max_data_transfer_bytes;
    response["lease"]["memory_page_size"] = id->memory_page_size;
    response["lease"]["doorbell_stride"] = id->doorbell_stride;
  }
  // PCI: the lease's sealed file of /dev/snvme<C> travels with the response (SCM_RIGHTS), described by "snvme".
  if (pci) {
    out_fds.push_back(pci->fd);
    response["lease"]["snvme"] = pci->to_json(out_fds.size() - 1);
    return response;
  }
  // Soft mode: the memfds of BAR0 and of each queue's rings travel with the response (SCM_RIGHTS); "fd" is
  // the index among the descriptors received.
  auto range = [&slot, &out_fds](const void* address) -> json {
    auto r = slot.shared_memory_of(address);
    if (!r) return nullptr;
    out_fds.push_back(r->fd);
    return json{{"fd", out_fds.size() - 1}, {"offset", r->offset}, {"length", r->length}};
  };
  json shared = {{"bar0", range(slot.bar0())}, {"csts_offset", 0x1c}, {"queues", json::array()}};
  const auto* bar = static_cast<const std::uint8_t*>(slot.bar0());
  for (auto qid : lease.qids) {
    const nvme::QueuePairInfo* info = slot.queue_info(qid);
    if (info == nullptr) continue;
    shared["queues"].push_back(
        {{"qid", qid},
         {"depth", info->depth},
         {"sq", range(info->submission_queue)},
         {"cq", range(info->completion_queue)},
         {"sq_tail_doorbell_offset",
          reinterpret_cast<const volatile std::uint8_t*>(info->submission_queue_tail_doorbell) - bar},
         {"cq_head_doorbell_offset",
          reinterpret_cast<const volatile std::uint8_t*>(info->completion_queue_head_doorbell) - bar}});
  }
  response["lease"]["shared_memory"] = shared;
  return response;
}

json Server::register_memory(const Request& request, Client& client, const std::vector<int>& fds) {
  auto it = leases_.find(request.lease);
  if (it == leases_.end())
    return error_response(errors::kNotFound, fmt::format("register: no lease {}", request.lease));
  Lease& lease = it->second;
  if (lease.peer.pid != client.peer.pid)
    return error_response(errors::kPermissionDenied, fmt::format("register: lease {} belongs to pid {}, not pid {}",
                                                                 request.lease, lease.peer.pid, client.peer.pid));
  if (lease.pci)
    return error_response(errors::kBadRequest,
                          fmt::format("register: lease {} is on a PCI controller: map memory with DMA_MAP on the "
                                      "sealed file that came with the lease",
                                      request.lease));
  if (fds.size() != 1)
    return error_response(
        errors::kBadRequest,
        fmt::format("register: {} file descriptors came with the request; expected 1 memfd", fds.size()));
  if (lease.registered_bytes + request.length > lease.pinned_bytes)
    return error_response(errors::kOverLimit,
                          fmt::format("register: {} bytes on lease {} (which has {} registered) is above its "
                                      "pinned_bytes {}",
                                      request.length, request.lease, lease.registered_bytes, lease.pinned_bytes));
  // The memory must not shrink while the controller may DMA into it (the daemon's access would raise SIGBUS):
  // only a memfd sealed with F_SEAL_SHRINK is accepted.
  const int seals = ::fcntl(fds[0], F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return error_response(errors::kBadRequest,
                          "register: the memory must be a memfd sealed with F_SEAL_SHRINK (memfd_create with "
                          "MFD_ALLOW_SEALING, then fcntl F_ADD_SEALS), so it cannot shrink under DMA");
  struct stat st {};
  if (::fstat(fds[0], &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) < request.length)
    return error_response(
        errors::kBadRequest,
        fmt::format("register: the file sent is not a memfd of at least length {} bytes", request.length));
  void* address = ::mmap(nullptr, request.length, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  if (address == MAP_FAILED)
    return error_response(errors::kBadRequest, fmt::format("register: mmap of the memfd: {}", std::strerror(errno)));
  auto mapping = controllers_[lease.controller]->dma_map(address, request.length);
  if (!mapping) {
    ::munmap(address, request.length);
    return error_response(errors::kInternal, mapping.status().to_string());
  }
  // The page table travels as runs of pages contiguous in bus space ([first bus address, pages]): one run for
  // a soft controller's window, however long the region. A table too scattered for one message is refused.
  json runs = json::array();
  for (std::size_t i = 0; i < mapping->bus_addresses.size(); ++i) {
    const std::uint64_t bus = mapping->bus_addresses[i];
    if (!runs.empty() &&
        runs.back()[0].get<std::uint64_t>() + runs.back()[1].get<std::uint64_t>() * mapping->page_size == bus)
      runs.back()[1] = runs.back()[1].get<std::uint64_t>() + 1;
    else
      runs.push_back({bus, 1});
  }
  if (runs.size() > kMaxRegisterRuns) {
    (void)controllers_[lease.controller]->dma_unmap(mapping->id);
    ::munmap(address, request.length);
    return error_response(errors::kOverLimit,
                          fmt::format("register: the {} bytes map to {} runs of bus pages, above the {} that fit one "
                                      "answer: register smaller regions",
                                      request.length, runs.size(), kMaxRegisterRuns));
  }
  lease.registered.push_back({mapping->id, address, request.length});
  lease.registered_bytes += request.length;
  json response = ok_response();
  response["region"] = {{"id", mapping->id}, {"page_size", mapping->page_size}, {"bus_runs", std::move(runs)}};
  return response;
}

void Server::end_lease(std::uint64_t id, std::string_view how, std::string_view reason) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  Lease& lease = it->second;
  ControllerSlot& slot = *controllers_[lease.controller];
  // PCI: the groups are destroyed through tuttid's copy of the file (the client's copy sees its rings
  // revoked), then that copy is closed; the driver frees the rest when the client's copies close.
  Status deleted = lease.pci ? slot.end_pci_lease(*lease.pci) : slot.delete_queues(lease.qids);
  if (!deleted.is_ok()) {
    // A queue may still be live (its Delete I/O SQ timed out), and a command of it may still DMA
    // into the client's memory: keep every region mapped for the daemon's lifetime rather than let
    // the device write memory that was unmapped or reused.
    say("lease {}: {}; its {} registered region(s) stay mapped until tuttid exits", id, deleted.to_string(),
        lease.registered.size());
  } else {
    // The queues are gone (Delete I/O SQ completes or aborts every command of it), so no DMA targets
    // the client's memory any more: unmap it.
    for (const auto& r : lease.registered) {
      Status unmapped = slot.dma_unmap(r.mapping_id);
      if (!unmapped.is_ok()) say("lease {}: {}", id, unmapped.to_string());
      ::munmap(r.address, r.length);
    }
  }
  if (how == "revoked") {
    json event = event_message("revoked");
    event["lease"] = id;
    event["reason"] = std::string(reason);
    send(lease.client_fd, event);
  }
  say("lease {} {}: pid {} on {}, queues {} returned ({})", id, how, lease.peer.pid, slot.config().name,
      fmt::join(lease.qids, ","), reason);
  if (lease.pidfd >= 0) ::close(lease.pidfd);
  leases_.erase(it);
  Status persisted = write_state();
  if (!persisted.is_ok()) say("{}", persisted.to_string());
}

json Server::release(const Request& request, Client& client) {
  auto it = leases_.find(request.lease);
  if (it == leases_.end()) {
    for (const auto& previous : previous_leases_)
      if (previous.value("id", std::uint64_t{0}) == request.lease)
        return error_response(errors::kNotFound,
                              fmt::format("release: lease {} was revoked when tuttid restarted", request.lease));
    return error_response(errors::kNotFound, fmt::format("release: no lease {}", request.lease));
  }
  if (it->second.peer.pid != client.peer.pid && client.peer.uid != 0)
    return error_response(errors::kPermissionDenied, fmt::format("release: lease {} belongs to pid {}, not pid {}",
                                                                 request.lease, it->second.peer.pid, client.peer.pid));
  ++metrics_.released;
  end_lease(request.lease, "released", "on request");
  return ok_response();
}

json Server::status_json() const {
  json s = ok_response();
  s["pid"] = ::getpid();
  s["protocol"] = kProtocolVersion;
  s["uptime_seconds"] = static_cast<double>(monotonic_ns() - started_ns_) * 1e-9;
  s["draining"] = draining_;
  s["drain_reason"] = drain_reason_;
  s["leases"] = leases_.size();
  s["controllers"] = controllers_.size();
  s["controllers_up"] = std::count_if(controllers_.begin(), controllers_.end(),
                                      [](const auto& c) { return c->state() == BringUpState::up; });
  s["restart_policy"] = "revoke";
  s["revoked_at_restart"] = previous_leases_;
  return s;
}

json Server::devices_json() const {
  json d = ok_response();
  d["devices"] = json::array();
  for (const auto& slot : controllers_) {
    const auto& c = slot->config();
    d["devices"].push_back({{"name", c.name},
                            {"kind", c.soft ? "soft" : "pci"},
                            {"source", c.soft ? c.soft->image : *c.pci_address},
                            {"state", std::string(to_string(slot->state()))},
                            {"error", slot->last_error()},
                            {"io_queue_pairs", c.io_queue_pairs},
                            {"kernel_queues", c.kernel_queues},
                            {"kernel_queue_ids", slot->kernel_qids()},
                            {"leasable_queues", c.leasable_queues()},
                            {"queues_in_use", slot->queues_in_use()},
                            {"queue_depth", c.queue_depth},
                            {"lba_size", slot->lba_size()},
                            {"namespace_size_lbas", slot->namespace_size_lbas()},
                            {"namespaces", slot->namespaces_json()},
                            {"accelerators", c.accelerators},
                            {"allow", {{"users", c.allowed_user_names}, {"groups", c.allowed_group_names}}}});
  }
  return d;
}

json Server::leases_json() const {
  json l = ok_response();
  l["leases"] = json::array();
  for (const auto& [id, lease] : leases_)
    l["leases"].push_back({{"id", id},
                           {"pid", lease.peer.pid},
                           {"uid", lease.peer.uid},
                           {"controller", controllers_[lease.controller]->config().name},
                           {"queues", lease.qids},
                           {"pinned_bytes", lease.pinned_bytes},
                           {"age_seconds", static_cast<double>(monotonic_ns() - lease.granted_ns) * 1e-9},
                           {"connected", lease.client_fd >= 0}});
  return l;
}

std::string Server::metrics_text() const {
  std::string out;
  auto family = [&out](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  family("tuttid_controller_up", "gauge", "1 when the controller is brought up, else 0.");
  for (const auto& s : controllers_)
    out += fmt::format("tuttid_controller_up{{controller=\"{}\",state=\"{}\"}} {}\n", s->config().name,
                       to_string(s->state()), s->state() == BringUpState::up ? 1 : 0);
  family("tuttid_controller_bring_up_errors_total", "counter", "Failed bring-ups of the controller.");
  for (const auto& s : controllers_)
    out += fmt::format("tuttid_controller_bring_up_errors_total{{controller=\"{}\"}} {}\n", s->config().name,
                       s->bring_up_errors());
  family("tuttid_queues_in_use", "gauge", "Leased I/O queue pairs.");
  for (const auto& s : controllers_)
    out += fmt::format("tuttid_queues_in_use{{controller=\"{}\"}} {}\n", s->config().name, s->queues_in_use());
  family("tuttid_queues_leasable", "gauge", "I/O queue pairs clients can lease (io_queue_pairs - kernel_queues).");
  for (const auto& s : controllers_)
    out += fmt::format("tuttid_queues_leasable{{controller=\"{}\"}} {}\n", s->config().name,
                       s->config().leasable_queues());
  family("tuttid_leases", "gauge", "Leases held now.");
  for (std::size_t i = 0; i < controllers_.size(); ++i)
    out += fmt::format(
        "tuttid_leases{{controller=\"{}\"}} {}\n", controllers_[i]->config().name,
        std::count_if(leases_.begin(), leases_.end(), [i](const auto& l) { return l.second.controller == i; }));
  family("tuttid_leases_total", "counter", "Leases ended, by how: released, reclaimed (client died), revoked.");
  out += fmt::format("tuttid_leases_total{{event=\"granted\"}} {}\n", metrics_.granted);
  out += fmt::format("tuttid_leases_total{{event=\"released\"}} {}\n", metrics_.released);
  out += fmt::format("tuttid_leases_total{{event=\"reclaimed\"}} {}\n", metrics_.reclaimed);
  out += fmt::format("tuttid_leases_total{{event=\"revoked\"}} {}\n", metrics_.revoked);
  out += fmt::format("tuttid_leases_total{{event=\"revoked_at_restart\"}} {}\n", metrics_.revoked_at_restart);
  family("tuttid_lease_refusals_total", "counter", "Refused acquire requests, by error code.");
  for (const auto& [code, n] : metrics_.refused)
    out += fmt::format("tuttid_lease_refusals_total{{code=\"{}\"}} {}\n", code, n);
  family("tuttid_bad_requests_total", "counter", "Messages refused by the protocol parser.");
  out += fmt::format("tuttid_bad_requests_total {}\n", metrics_.bad_requests);
  family("tuttid_lease_grant_seconds_sum", "counter", "Time spent granting leases (queue creation included).");
  out += fmt::format("tuttid_lease_grant_seconds_sum {:.9f}\n", metrics_.grant_seconds_sum);
  family("tuttid_lease_reclaim_seconds", "gauge",
         "From the holder's pidfd becoming readable (it died) to its queues deleted: last and max.");
  out += fmt::format("tuttid_lease_reclaim_seconds{{stat=\"last\"}} {:.9f}\n", metrics_.reclaim_seconds_last);
  out += fmt::format("tuttid_lease_reclaim_seconds{{stat=\"max\"}} {:.9f}\n", metrics_.reclaim_seconds_max);
  family("tuttid_draining", "gauge", "1 while no new leases are granted (drain or SIGTERM).");
  out += fmt::format("tuttid_draining {}\n", draining_ ? 1 : 0);
  return out;
}

void Server::start_drain(std::uint64_t deadline_ms, std::string_view why) {
  if (!draining_) {
    draining_ = true;
    drain_reason_ = std::string(why);
    drain_deadline_ns_ = deadline_after_ns(deadline_ms * 1'000'000);
  } else {
    drain_deadline_ns_ = std::min(drain_deadline_ns_, deadline_after_ns(deadline_ms * 1'000'000));
  }
  say("draining ({}): {} {} ms to be released, then {} revoked", why,
      leases_.size() == 1 ? std::string("1 lease gets") : fmt::format("{} leases get", leases_.size()), deadline_ms,
      leases_.size() == 1 ? "is" : "are");
  for (const auto& [id, lease] : leases_) {
    json event = event_message("revoking");
    event["lease"] = id;
    event["deadline_ms"] = deadline_ms;
    event["reason"] = std::string(why);
    send(lease.client_fd, event);
  }
}

// The driver revoked every open file of a PCI controller (a reset: POLLPRI; a failure or removal: POLLHUP
// too): the leases' queues are gone from the controller, so each lease is revoked (its holder is told), then
// tuttid's own files are opened again (docs/daemon.md, "PCI controllers").
void Server::controller_reset(std::size_t controller, bool lost) {
  ControllerSlot& slot = *controllers_[controller];
  const std::string reason = lost ? "the controller failed or was removed" : "controller reset";
  std::vector<std::uint64_t> ids;
  for (const auto& [id, lease] : leases_)
    if (lease.controller == controller) ids.push_back(id);
  say("controller {}: {}: revoking {} lease(s)", slot.config().name, reason, ids.size());
  for (auto id : ids) {
    ++metrics_.revoked;
    end_lease(id, "revoked", reason);
  }
  Status recovered = slot.recover(lost);
  say("controller {}: {}", slot.config().name, recovered.is_ok() ? "up again" : recovered.to_string());
}

json Server::handle(const Request& request, Client& client, const std::vector<int>& fds, std::vector<int>& out_fds) {
  switch (request.op) {
    case Op::acquire: return acquire(request, client, out_fds);
    case Op::register_memory: return register_memory(request, client, fds);
    case Op::release: return release(request, client);
    case Op::status: return status_json();
    case Op::devices: return devices_json();
    case Op::leases: return leases_json();
    case Op::metrics: {
      json m = ok_response();
      m["text"] = metrics_text();
      return m;
    }
    case Op::drain:
      if (client.peer.uid != 0 && client.peer.uid != ::getuid())
        return error_response(
            errors::kPermissionDenied,
            fmt::format("drain: uid {} is neither root nor tuttid's uid {}", client.peer.uid, ::getuid()));
      start_drain(request.deadline_ms.value_or(config_.shutdown_grace_ms), "tuttictl drain");
      return ok_response();
  }
  return error_response(errors::kInternal, "unhandled op");
}

void Server::handle_message(Client& client) {
  std::vector<char> buffer(kMaxMessageBytes + 1);
  iovec io{buffer.data(), buffer.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  header.msg_control = control;
  header.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(client.fd, &header, MSG_TRUNC | MSG_CMSG_CLOEXEC);
  std::vector<int> fds;  // closed when this function returns, whatever happens
  for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() {
      for (int fd : fds) ::close(fd);
    }
  } close_all{fds};
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    close_client(client.fd);
    return;
  }
  if (static_cast<std::size_t>(n) > kMaxMessageBytes) {
    ++metrics_.bad_requests;
    send(client.fd, error_response(errors::kBadRequest, fmt::format("message of {} bytes is above the limit of {} "
                                                                    "bytes",
                                                                    n, kMaxMessageBytes)));
    return;
  }
  auto request = parse_request(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
  if (!request) {
    ++metrics_.bad_requests;
    const bool version = request.status().message().starts_with("unsupported protocol version");
    send(client.fd,
         error_response(version ? errors::kUnsupportedVersion : errors::kBadRequest, request.status().message()));
    return;
  }
  std::vector<int> out_fds;  // the controller's memfds: sent, not closed
  json response = handle(*request, client, fds, out_fds);
  send(client.fd, response, out_fds);
}

Status Server::loop() {
  for (;;) {
    if (draining_ && (leases_.empty() || remaining_ns(drain_deadline_ns_) == 0)) {
      std::vector<std::uint64_t> ids;
      for (const auto& [id, lease] : leases_) ids.push_back(id);
      for (auto id : ids) {
        ++metrics_.revoked;
        end_lease(id, "revoked", drain_reason_);
      }
      if (stopping_) break;
    }
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> lease_of;  // per fds entry: lease id for pidfds, 0 otherwise
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({signal_fd_, POLLIN, 0});
    lease_of.assign(2, 0);
    for (const auto& [fd, client] : clients_) fds.push_back({fd, POLLIN, 0}), lease_of.push_back(0);
    for (const auto& [id, lease] : leases_) fds.push_back({lease.pidfd, POLLIN, 0}), lease_of.push_back(id);
    const std::size_t first_controller = fds.size();  // PCI controllers' files: the driver's reset events
    std::vector<std::size_t> controller_of;
    for (std::size_t c = 0; c < controllers_.size(); ++c)
      if (controllers_[c]->event_fd() >= 0)
        fds.push_back({controllers_[c]->event_fd(), POLLPRI, 0}), controller_of.push_back(c);
    int timeout_ms = -1;
    if (draining_ && !leases_.empty())
      timeout_ms = static_cast<int>(std::min<std::uint64_t>(remaining_ns(drain_deadline_ns_) / 1'000'000 + 1, 60'000));
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) return error(StatusCode::INTERNAL, "poll: {}", std::strerror(errno));
    if (ready <= 0) continue;
    const std::uint64_t woke_ns = monotonic_ns();
    for (std::size_t i = first_controller; i < fds.size(); ++i)
      if (fds[i].revents & (POLLPRI | POLLERR | POLLHUP))
        controller_reset(controller_of[i - first_controller], (fds[i].revents & POLLHUP) != 0);
    // Client deaths first: their queues are free before this round's acquires are served.
    for (std::size_t i = 2 + clients_.size(); i < first_controller; ++i) {
      if (leases_.count(lease_of[i]) == 0) continue;  // revoked by a controller reset above
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ++metrics_.reclaimed;
      end_lease(lease_of[i], "reclaimed", "the client process exited");
      const double seconds = static_cast<double>(monotonic_ns() - woke_ns) * 1e-9;
      metrics_.reclaim_seconds_last = seconds;
      metrics_.reclaim_seconds_max = std::max(metrics_.reclaim_seconds_max, seconds);
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        say("signal {}: stopping", info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
        stopping_ = true;
        start_drain(config_.shutdown_grace_ms, info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
      }
    }
    for (std::size_t i = 2; i < 2 + clients_.size() && i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      auto it = clients_.find(fds[i].fd);
      if (it == clients_.end()) continue;
      if (fds[i].revents & POLLIN)
        handle_message(it->second);
      else
        close_client(fds[i].fd);
    }
    if (fds[0].revents & POLLIN) accept_client();
  }
  for (auto& slot : controllers_) {
    Status released = slot->release_mounts();
    if (!released.is_ok()) say("controller {}: {}", slot->config().name, released.to_string());
    Status stopped = slot->shut_down();
    say("controller {} {}{}", slot->config().name, stopped.is_ok() ? "stopped" : stopped.to_string(),
        slot->stop_note().empty() ? "" : "; " + slot->stop_note());
  }
  Status persisted = write_state();
  say("stopped");
  return persisted;
}

}  // namespace

Status run_daemon(const Config& config, std::FILE* log) {
  Server server(config, log);
  TUTTI_RETURN_IF_ERROR(server.start());
  return server.loop();
}

}  // namespace tutti::daemon
