// tuttid's server: the socket, the leases, client-death reclaim through pidfds, drain and stop, the state
// file and the restart policy (docs/daemon.md). One thread runs everything from one poll() loop.
#pragma once

#include <cstdio>

#include <tutti/core/status.hpp>

#include "config.hpp"

namespace tutti::daemon {

/// Runs the daemon until SIGTERM or SIGINT (then drains: clients get config.shutdown_grace_ms to release
/// their leases, the rest are revoked) and returns the exit status. Log lines go to `log`. Errors (before the
/// loop starts): another tuttid listens on the socket, the socket cannot be created, the state file cannot
/// be written.
Status run_daemon(const Config& config, std::FILE* log);

}  // namespace tutti::daemon
