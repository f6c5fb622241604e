// tuttid's configuration: a JSON file with comments (default /etc/tutti/tuttid.json, `tuttid --config`).
// Every key, its type, default and limit is listed in docs/daemon.md ("Configuration keys"); parse_config
// rejects unknown keys and every out-of-range value with an error naming the key path ("controllers[1].allow
// .users[0]"), the value and what was expected.
// Thread-safety: the functions are pure (load_config reads one file, and resolves user and group names with
// getpwnam_r / getgrnam_r); a Config is a value.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tutti/core/status.hpp>

namespace tutti::daemon {

inline constexpr std::string_view kDefaultConfigPath = "/etc/tutti/tuttid.json";
inline constexpr std::string_view kDefaultSocketPath = "/run/tutti/tuttid.sock";
inline constexpr std::string_view kDefaultStatePath = "/run/tutti/tuttid.state";
inline constexpr std::uint32_t kDefaultSocketMode = 0660;
inline constexpr std::uint64_t kDefaultShutdownGraceMs = 5000;
inline constexpr std::uint32_t kDefaultClientQueues = 1;
inline constexpr std::uint32_t kDefaultClientMaxQueues = 4;
inline constexpr std::uint64_t kDefaultClientPinnedBytes = 256ull << 20;
inline constexpr std::uint64_t kDefaultClientMaxPinnedBytes = 4ull << 30;
inline constexpr std::uint32_t kDefaultIoQueuePairs = 16;
inline constexpr std::uint32_t kDefaultKernelQueues = 1;
inline constexpr std::uint32_t kDefaultQueueDepth = 256;

/// What one client process may take from one controller. A "client" is one process (its pid).
struct ClientLimits {
  std::uint32_t default_queues = kDefaultClientQueues;             ///< queues of an acquire that names none
  std::uint32_t max_queues = kDefaultClientMaxQueues;              ///< queues one process may hold, all its leases
  std::uint64_t default_pinned_bytes = kDefaultClientPinnedBytes;  ///< bytes of an acquire that names none
  std::uint64_t max_pinned_bytes = kDefaultClientMaxPinnedBytes;   ///< pinned bytes one process may hold
};

/// A namespace of a controller and where its file system is mounted.
struct NamespaceConfig {
  std::uint32_t nsid = 1;           ///< 1-based NSID
  std::string mount;                ///< absolute path of the mount point; empty: not mounted
  std::string filesystem = "ext4";  ///< file system type of the mount
};

/// A soft controller (libnvm's software NVMe controller) run inside tuttid, backed by an image file.
struct SoftSettings {
  std::string image;                       ///< absolute path of the backing file or block device
  std::uint32_t lba_size = 4096;           ///< 512 or 4096
  std::uint32_t max_queue_entries = 1024;  ///< CAP.MQES + 1, 2..65536
};

/// One controller tuttid owns. Exactly one of pci_address and soft is set.
struct ControllerConfig {
  std::string name;                                     ///< unique, [a-z0-9_-]{1,32}
  std::optional<std::string> pci_address;               ///< DDDD:BB:DD.F, bound through /dev/snvme-control
  std::optional<SoftSettings> soft;                     ///< a soft controller run by the daemon
  std::uint32_t io_queue_pairs = kDefaultIoQueuePairs;  ///< I/O queue pairs requested (Number of Queues)
  std::uint32_t kernel_queues = kDefaultKernelQueues;   ///< of those, kept for the kernel, never leased
  std::uint32_t queue_depth = kDefaultQueueDepth;       ///< entries of each leased queue pair
  std::vector<NamespaceConfig> namespaces;
  std::vector<uid_t> allowed_uids;                                   ///< allow.users, resolved
  std::vector<gid_t> allowed_gids;                                   ///< allow.groups, resolved
  std::vector<std::string> allowed_user_names, allowed_group_names;  ///< as written
  std::vector<std::uint32_t> accelerators;  ///< accelerator (GPU) ordinals whose clients use this controller
  ClientLimits client;                      ///< client_defaults, overridden by this controller's "client"
  /// Queue pairs clients can lease: io_queue_pairs - kernel_queues.
  std::uint32_t leasable_queues() const noexcept { return io_queue_pairs - kernel_queues; }
};

struct Config {
  std::string socket_path{kDefaultSocketPath};
  std::uint32_t socket_mode = kDefaultSocketMode;
  std::optional<gid_t> socket_gid;  ///< socket.group, resolved; unset: the daemon's group
  std::string socket_group_name;
  std::string state_path{kDefaultStatePath};
  std::uint64_t shutdown_grace_ms = kDefaultShutdownGraceMs;
  ClientLimits client_defaults;
  std::vector<ControllerConfig> controllers;
};

/// Parses a configuration text (JSON, `//` and `/* */` comments allowed). `origin` names it in errors.
/// Errors: INVALID_ARGUMENT "<origin>: <key path>: <value> <what was expected>" for syntax errors (with
/// the byte offset), unknown keys, wrong types, out-of-range values, unknown users or groups, duplicates.
Result<Config> parse_config(std::string_view text, std::string_view origin = "config");

/// Reads and parses `path`. Errors: NOT_FOUND (cannot be read: errno text), those of parse_config.
Result<Config> load_config(const std::string& path);

}  // namespace tutti::daemon
