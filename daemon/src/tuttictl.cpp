// tuttictl: inspects and drains tuttid (docs/daemon.md).
//   tuttictl [--socket PATH] [--json] status|devices|leases|metrics|drain [--deadline-ms N]
// Exit status: 0 done; 1 tuttid refused or failed the request, or the connection broke; 2 a bad command line (an
// unknown subcommand, a bad flag or value); 3 tuttid could not be reached at the socket (not running, a wrong
// --socket, no permission on it).
#include <CLI/CLI.hpp>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "client.hpp"
#include "config.hpp"
#include "protocol.hpp"

namespace {

using json = nlohmann::json;

constexpr int kExitRefused = 1;      ///< tuttid answered with an error, or the connection broke
constexpr int kExitUsage = 2;        ///< a bad command line
constexpr int kExitUnreachable = 3;  ///< no tuttid at the socket
constexpr const char* kSubcommands = "status, devices, leases, metrics, drain";

/// Why connect() to `socket_path` failed, for a person: what is there, what it means, what to do.
std::string unreachable_hint(const std::string& socket_path, const tutti::Status& failure) {
  const std::string where = fmt::format(
      "point tuttictl at tuttid's socket with --socket PATH (socket.path of its configuration; the default is {})",
      tutti::daemon::kDefaultSocketPath);
  struct stat st {};
  if (::stat(socket_path.c_str(), &st) != 0)
    return fmt::format(
        "no socket at {}: tuttid is not running, or the path is wrong; start tuttid (docs/daemon.md) or {}",
        socket_path, where);
  if (!S_ISSOCK(st.st_mode)) return fmt::format("{} is not a socket: the path is wrong; {}", socket_path, where);
  if (failure.code() == tutti::StatusCode::UNSUPPORTED)
    return fmt::format("{}: add the user to the socket's group (socket.group of tuttid's configuration), or {}",
                       failure.message(), where);
  return fmt::format(
      "nothing listens on {} ({}): tuttid is not running (a socket left by one that stopped), or the path is wrong; "
      "start tuttid (docs/daemon.md) or {}",
      socket_path, failure.message(), where);
}

// A table with a header row, columns padded to their widest cell.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], row[i].size());
  auto line = [&width](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i)
      out += fmt::format("{:<{}}{}", cells[i], width[i], i + 1 < cells.size() ? "  " : "");
    while (!out.empty() && out.back() == ' ') out.pop_back();
    std::puts(out.c_str());
  };
  line(header);
  for (const auto& row : rows) line(row);
}

std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
std::string joined(const json& array) {
  std::string out;
  for (const auto& v : array) out += (out.empty() ? "" : ",") + text(v);
  return out.empty() ? "-" : out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tuttictl: inspect and drain tuttid (docs/daemon.md)"};
  app.footer(
      "Exit status: 0 done; 1 tuttid refused or failed the request (its error printed), or the connection broke; 2 a "
      "bad command line (an unknown subcommand, a bad flag or value); 3 tuttid could not be reached at the socket "
      "(not running, a wrong --socket, no permission on it).");
  std::string socket_path{tutti::daemon::kDefaultSocketPath};
  bool as_json = false;
  std::uint64_t deadline_ms = 0;
  bool deadline_given = false;
  app.add_option("--socket", socket_path, "tuttid's socket")->capture_default_str();
  app.add_flag("--json", as_json, "print the daemon's JSON response instead of a table");
  app.require_subcommand(1);
  auto* status = app.add_subcommand("status", "the daemon: pid, uptime, leases, draining, restart revocations");
  auto* devices = app.add_subcommand("devices", "controllers: state, queues, namespaces, allow lists");
  auto* leases = app.add_subcommand("leases", "leases: id, pid, uid, controller, queue IDs, pinned bytes");
  auto* metrics = app.add_subcommand("metrics", "metrics in the Prometheus text format");
  auto* drain = app.add_subcommand("drain", "refuse new leases; revoke held ones after the deadline");
  drain->add_option("--deadline-ms", deadline_ms, "how long holders get (default: shutdown_grace_ms)")
      ->check(CLI::Range(0, 3'600'000))
      ->each([&deadline_given](const std::string&) { deadline_given = true; });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // No subcommand recognised (CLI11 says "A subcommand is required" or names the extra words): say which are.
    const bool no_subcommand =
        dynamic_cast<const CLI::RequiredError*>(&e) != nullptr || dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
    if (no_subcommand && app.get_subcommands().empty()) {
      for (const std::string& word : app.remaining())
        if (!word.empty() && word[0] != '-') {
          std::fprintf(stderr, "tuttictl: unknown subcommand '%s': expected one of %s (tuttictl --help)\n",
                       word.c_str(), kSubcommands);
          return kExitUsage;
        }
      if (app.remaining().empty()) {
        std::fprintf(stderr, "tuttictl: no subcommand: give one of %s (tuttictl --help)\n", kSubcommands);
        return kExitUsage;
      }
    }
    return app.exit(e) == 0 ? 0 : kExitUsage;  // --help: 0; a bad flag or value: 2, as a bad configuration
  }

  tutti::daemon::Request request;
  if (status->parsed()) request.op = tutti::daemon::Op::status;
  if (devices->parsed()) request.op = tutti::daemon::Op::devices;
  if (leases->parsed()) request.op = tutti::daemon::Op::leases;
  if (metrics->parsed()) request.op = tutti::daemon::Op::metrics;
  if (drain->parsed()) {
    request.op = tutti::daemon::Op::drain;
    if (deadline_given) request.deadline_ms = deadline_ms;
  }
  auto connection = tutti::daemon::Connection::connect(socket_path);
  if (!connection) {
    if (connection.code() == tutti::StatusCode::NOT_FOUND || connection.code() == tutti::StatusCode::UNSUPPORTED) {
      std::fprintf(stderr, "tuttictl: %s\n", unreachable_hint(socket_path, connection.status()).c_str());
      return kExitUnreachable;
    }
    std::fprintf(stderr, "tuttictl: %s\n", connection.status().to_string().c_str());
    return connection.code() == tutti::StatusCode::INVALID_ARGUMENT ? kExitUsage : kExitUnreachable;
  }
  auto response = connection->call(json::parse(tutti::daemon::to_message(request)), 10'000'000'000ull);
  if (!response) {
    std::fprintf(stderr, "tuttictl: %s\n", response.status().to_string().c_str());
    return kExitRefused;
  }
  const json& r = *response;
  if (!r.value("ok", false)) {
    std::fprintf(stderr, "tuttictl: %s: %s\n", r["error"].value("code", "?").c_str(),
                 r["error"].value("message", "?").c_str());
    return kExitRefused;
  }
  if (as_json) {
    std::puts(r.dump(2).c_str());
    return 0;
  }
  switch (request.op) {
    case tutti::daemon::Op::status:
      print_table({"pid", "uptime_s", "leases", "controllers_up", "draining", "restart_policy", "revoked_at_restart"},
                  {{text(r["pid"]), fmt::format("{:.1f}", r["uptime_seconds"].get<double>()), text(r["leases"]),
                    fmt::format("{}/{}", text(r["controllers_up"]), text(r["controllers"])),
                    r["draining"].get<bool>() ? "yes" : "no", text(r["restart_policy"]),
                    std::to_string(r["revoked_at_restart"].size())}});
      break;
    case tutti::daemon::Op::devices: {
      std::vector<std::vector<std::string>> rows;
      for (const auto& d : r["devices"]) {
        // "1:/mnt/kv0 (mounted from /dev/loop0)" per namespace with a mount point.
        std::string mounts;
        for (const auto& n : d.value("namespaces", json::array()))
          if (!n.value("mount", std::string()).empty())
            mounts += fmt::format("{}{}:{}{}", mounts.empty() ? "" : ",", text(n["nsid"]), text(n["mount"]),
                                  n.contains("mount_state")
                                      ? fmt::format(" ({} from {})", text(n["mount_state"]), text(n["block_device"]))
                                      : std::string(" (not mounted)"));
        rows.push_back({text(d["name"]), text(d["kind"]), text(d["source"]), text(d["state"]),
                        fmt::format("{}/{}", text(d["queues_in_use"]), text(d["leasable_queues"])),
                        text(d["kernel_queues"]), text(d["queue_depth"]), joined(d["accelerators"]),
                        joined(d["allow"]["users"]), joined(d["allow"]["groups"]), mounts.empty() ? "-" : mounts,
                        d["error"].get<std::string>().empty() ? "-" : text(d["error"])});
      }
      print_table({"name", "kind", "source", "state", "in_use/leasable", "kernel_q", "depth", "accelerators", "users",
                   "groups", "mounts", "error"},
                  rows);
      break;
    }
    case tutti::daemon::Op::leases: {
      std::vector<std::vector<std::string>> rows;
      for (const auto& l : r["leases"])
        rows.push_back({text(l["id"]), text(l["pid"]), text(l["uid"]), text(l["controller"]), joined(l["queues"]),
                        text(l["pinned_bytes"]), fmt::format("{:.1f}", l["age_seconds"].get<double>()),
                        l["connected"].get<bool>() ? "yes" : "no"});
      print_table({"id", "pid", "uid", "controller", "queues", "pinned_bytes", "age_s", "connected"}, rows);
      break;
    }
    case tutti::daemon::Op::metrics: std::fputs(r["text"].get<std::string>().c_str(), stdout); break;
    case tutti::daemon::Op::drain:
      std::puts("tuttid: draining: no new leases; held leases revoked at the deadline");
      break;
    default: break;
  }
  return 0;
}
