// tuttid configuration parser: see config.hpp and docs/daemon.md.
#include "config.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace tutti::daemon {
namespace {

using json = nlohmann::json;

struct ConfigError {
  std::string message;
};

[[noreturn]] void fail(const std::string& path, const json& value, std::string_view expected) {
  throw ConfigError{fmt::format("{}: {} {}", path, value.dump(), expected)};
}

std::string type_name(const json& v) { return v.type_name(); }

const json& require_object(const json& v, const std::string& path) {
  if (!v.is_object()) fail(path, v, fmt::format("is a {}; expected an object", type_name(v)));
  return v;
}

void check_keys(const json& object, const std::string& path, std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (auto k : known) found = found || key == k;
    if (!found) {
      std::string list;
      for (auto k : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
      throw ConfigError{fmt::format("{}: unknown key \"{}\"; expected one of: {}", path, key, list)};
    }
  }
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

std::uint64_t get_uint(const json& v, const std::string& path, std::uint64_t min, std::uint64_t max) {
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0))
    fail(path, v, fmt::format("is not an integer in [{}, {}]", min, max));
  const auto n = v.get<std::uint64_t>();
  if (n < min || n > max) fail(path, v, fmt::format("is out of range; expected an integer in [{}, {}]", min, max));
  return n;
}

std::string get_string(const json& v, const std::string& path) {
  if (!v.is_string()) fail(path, v, fmt::format("is a {}; expected a string", type_name(v)));
  return v.get<std::string>();
}

std::string get_absolute_path(const json& v, const std::string& path) {
  auto s = get_string(v, path);
  if (s.empty() || s[0] != '/' || s.find('\0') != std::string::npos || s.size() > 4095)
    fail(path, v, "is not an absolute path; expected a path starting with /");
  return s;
}

/// `path` with "." and ".." and doubled slashes resolved textually, no trailing slash: one spelling per mount point.
std::string fs_normal(const std::string& path) {
  std::string normal = std::filesystem::path(path).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}

bool valid_pci_address(const std::string& s) {  // DDDD:BB:DD.F, hexadecimal, function 0..7
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (std::size_t i : {0u, 1u, 2u, 3u, 5u, 6u, 8u, 9u})
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return s[11] >= '0' && s[11] <= '7';
}

std::optional<uid_t> lookup_user(const std::string& name) {
  struct passwd pw {
  }, *out = nullptr;
  std::vector<char> buffer(16384);
  if (getpwnam_r(name.c_str(), &pw, buffer.data(), buffer.size(), &out) != 0 || out == nullptr) return std::nullopt;
  return out->pw_uid;
}

std::optional<gid_t> lookup_group(const std::string& name) {
  struct group gr {
  }, *out = nullptr;
  std::vector<char> buffer(65536);
  if (getgrnam_r(name.c_str(), &gr, buffer.data(), buffer.size(), &out) != 0 || out == nullptr) return std::nullopt;
  return out->gr_gid;
}

ClientLimits parse_limits(const json& v, const std::string& path, ClientLimits limits) {
  require_object(v, path);
  check_keys(v, path, {"default_queues", "max_queues", "default_pinned_bytes", "max_pinned_bytes"});
  if (v.contains("max_queues")) limits.max_queues = get_uint(v["max_queues"], join(path, "max_queues"), 1, 65535);
  if (v.contains("default_queues"))
    limits.default_queues = get_uint(v["default_queues"], join(path, "default_queues"), 1, 65535);
  if (v.contains("max_pinned_bytes"))
    limits.max_pinned_bytes = get_uint(v["max_pinned_bytes"], join(path, "max_pinned_bytes"), 0, 1ull << 50);
  if (v.contains("default_pinned_bytes"))
    limits.default_pinned_bytes =
        get_uint(v["default_pinned_bytes"], join(path, "default_pinned_bytes"), 0, 1ull << 50);
  if (limits.default_queues > limits.max_queues)
    throw ConfigError{fmt::format("{}: default_queues {} is above max_queues {}; expected default_queues <= max_queues",
                                  path, limits.default_queues, limits.max_queues)};
  if (limits.default_pinned_bytes > limits.max_pinned_bytes)
    throw ConfigError{fmt::format(
        "{}: default_pinned_bytes {} is above max_pinned_bytes {}; expected default_pinned_bytes <= max_pinned_bytes",
        path, limits.default_pinned_bytes, limits.max_pinned_bytes)};
  return limits;
}

ControllerConfig parse_controller(const json& v, const std::string& path, const ClientLimits& defaults) {
  require_object(v, path);
  check_keys(v, path,
             {"name", "pci_address", "soft", "io_queue_pairs", "kernel_queues", "queue_depth", "namespaces", "allow",
              "accelerators", "client"});
  ControllerConfig c;
  if (!v.contains("name")) throw ConfigError{fmt::format("{}: missing key \"name\"; expected a controller name", path)};
  c.name = get_string(v["name"], join(path, "name"));
  if (!valid_name(c.name)) fail(join(path, "name"), v["name"], "is not a valid name; expected 1 to 32 of [a-z0-9_-]");
  const bool has_pci = v.contains("pci_address"), has_soft = v.contains("soft");
  if (has_pci == has_soft)
    throw ConfigError{fmt::format("{}: {}; expected exactly one of \"pci_address\" and \"soft\"", path,
                                  has_pci ? "both \"pci_address\" and \"soft\" are given"
                                          : "neither \"pci_address\" "
                                            "nor \"soft\" is given")};
  if (has_pci) {
    c.pci_address = get_string(v["pci_address"], join(path, "pci_address"));
    if (!valid_pci_address(*c.pci_address))
      fail(join(path, "pci_address"), v["pci_address"],
           "is not a PCI address; expected DDDD:BB:DD.F, e.g. 0000:01:00.0");
  } else {
    const std::string sp = join(path, "soft");
    const json& s = require_object(v["soft"], sp);
    check_keys(s, sp, {"image", "lba_size", "max_queue_entries"});
    SoftSettings soft;
    if (!s.contains("image"))
      throw ConfigError{fmt::format("{}: missing key \"image\"; expected the path of the image file", sp)};
    soft.image = get_absolute_path(s["image"], join(sp, "image"));
    if (s.contains("lba_size")) {
      soft.lba_size = get_uint(s["lba_size"], join(sp, "lba_size"), 512, 4096);
      if (soft.lba_size != 512 && soft.lba_size != 4096)
        fail(join(sp, "lba_size"), s["lba_size"], "expected 512 or 4096");
    }
    if (s.contains("max_queue_entries"))
      soft.max_queue_entries = get_uint(s["max_queue_entries"], join(sp, "max_queue_entries"), 2, 65536);
    c.soft = soft;
  }
  if (v.contains("io_queue_pairs"))
    c.io_queue_pairs = get_uint(v["io_queue_pairs"], join(path, "io_queue_pairs"), 1, 65535);
  if (v.contains("kernel_queues"))
    c.kernel_queues = get_uint(v["kernel_queues"], join(path, "kernel_queues"), 0, 65535);
  if (c.kernel_queues >= c.io_queue_pairs)
    throw ConfigError{
        fmt::format("{}: kernel_queues {} leaves no queue to lease of io_queue_pairs {}; expected "
                    "kernel_queues < io_queue_pairs",
                    path, c.kernel_queues, c.io_queue_pairs)};
  if (v.contains("queue_depth")) c.queue_depth = get_uint(v["queue_depth"], join(path, "queue_depth"), 2, 65536);
  if (c.soft && c.queue_depth > c.soft->max_queue_entries)
    throw ConfigError{
        fmt::format("{}: queue_depth {} is above soft.max_queue_entries {}; expected queue_depth <= "
                    "soft.max_queue_entries",
                    path, c.queue_depth, c.soft->max_queue_entries)};
  if (v.contains("namespaces")) {
    const std::string np = join(path, "namespaces");
    if (!v["namespaces"].is_array()) fail(np, v["namespaces"], "expected an array of namespaces");
    std::set<std::uint32_t> nsids;
    std::size_t i = 0;
    for (const auto& n : v["namespaces"]) {
      const std::string ep = fmt::format("{}[{}]", np, i++);
      require_object(n, ep);
      check_keys(n, ep, {"nsid", "mount", "filesystem"});
      NamespaceConfig ns;
      if (n.contains("nsid")) ns.nsid = get_uint(n["nsid"], join(ep, "nsid"), 1, 0xFFFFFFFEu);
      if (!nsids.insert(ns.nsid).second)
        fail(join(ep, "nsid"), json(ns.nsid), "is listed twice; expected unique NSIDs");
      if (n.contains("mount")) {
        ns.mount = get_absolute_path(n["mount"], join(ep, "mount"));
        while (ns.mount.size() > 1 && ns.mount.back() == '/') ns.mount.pop_back();  // "/mnt/kv0/" is "/mnt/kv0"
      }
      if (n.contains("filesystem")) {
        ns.filesystem = get_string(n["filesystem"], join(ep, "filesystem"));
        if (ns.filesystem != "ext4" && ns.filesystem != "xfs")
          fail(join(ep, "filesystem"), n["filesystem"], "is not supported; expected \"ext4\" or \"xfs\"");
      }
      c.namespaces.push_back(ns);
    }
  }
  if (v.contains("allow")) {
    const std::string ap = join(path, "allow");
    const json& a = require_object(v["allow"], ap);
    check_keys(a, ap, {"users", "groups"});
    for (std::string_view key : {"users", "groups"}) {
      if (!a.contains(key)) continue;
      const std::string lp = join(ap, key);
      if (!a[std::string(key)].is_array()) fail(lp, a[std::string(key)], "expected an array of names or numeric ids");
      std::size_t i = 0;
      for (const auto& entry : a[std::string(key)]) {
        const std::string ep = fmt::format("{}[{}]", lp, i++);
        const bool users = key == "users";
        if (entry.is_number_integer()) {
          const auto id = get_uint(entry, ep, 0, 0xFFFFFFFEu);
          (users ? c.allowed_user_names : c.allowed_group_names).push_back(std::to_string(id));
          if (users)
            c.allowed_uids.push_back(static_cast<uid_t>(id));
          else
            c.allowed_gids.push_back(static_cast<gid_t>(id));
          continue;
        }
        const auto name = get_string(entry, ep);
        if (users) {
          auto uid = lookup_user(name);
          if (!uid) fail(ep, entry, "is not a user of this host (getpwnam found none); expected a user name or a uid");
          c.allowed_uids.push_back(*uid);
          c.allowed_user_names.push_back(name);
        } else {
          auto gid = lookup_group(name);
          if (!gid)
            fail(ep, entry, "is not a group of this host (getgrnam found none); expected a group name or a gid");
          c.allowed_gids.push_back(*gid);
          c.allowed_group_names.push_back(name);
        }
      }
    }
  }
  if (v.contains("accelerators")) {
    const std::string ap = join(path, "accelerators");
    if (!v["accelerators"].is_array()) fail(ap, v["accelerators"], "expected an array of accelerator ordinals");
    std::size_t i = 0;
    for (const auto& a : v["accelerators"])
      c.accelerators.push_back(get_uint(a, fmt::format("{}[{}]", ap, i++), 0, 1023));
  }
  c.client = v.contains("client") ? parse_limits(v["client"], join(path, "client"), defaults) : defaults;
  if (c.client.max_queues > c.leasable_queues())
    throw ConfigError{fmt::format(
        "{}: client.max_queues {} is above the {} leasable queues (io_queue_pairs {} - "
        "kernel_queues {}); expected at most {}",
        path, c.client.max_queues, c.leasable_queues(), c.io_queue_pairs, c.kernel_queues, c.leasable_queues())};
  return c;
}

Config parse(const json& root) {
  require_object(root, "(top level)");
  check_keys(root, "(top level)", {"socket", "state_file", "shutdown_grace_ms", "client_defaults", "controllers"});
  Config config;
  if (root.contains("socket")) {
    const json& s = require_object(root["socket"], "socket");
    check_keys(s, "socket", {"path", "mode", "group"});
    if (s.contains("path")) {
      config.socket_path = get_absolute_path(s["path"], "socket.path");
      if (config.socket_path.size() >= 108)
        fail("socket.path", s["path"], "is too long for a Unix socket; expected at most 107 bytes");
    }
    if (s.contains("mode")) {
      const auto text = get_string(s["mode"], "socket.mode");
      char* end = nullptr;
      const unsigned long mode = std::strtoul(text.c_str(), &end, 8);
      if (text.size() != 4 || text[0] != '0' || *end != '\0' || (mode & 0007) != 0)
        fail("socket.mode", s["mode"],
             "is not an octal mode without permissions for others; expected e.g. \"0660\" or \"0600\"");
      config.socket_mode = static_cast<std::uint32_t>(mode);
    }
    if (s.contains("group")) {
      config.socket_group_name = get_string(s["group"], "socket.group");
      auto gid = lookup_group(config.socket_group_name);
      if (!gid)
        fail("socket.group", s["group"], "is not a group of this host (getgrnam found none); expected a group name");
      config.socket_gid = *gid;
    }
  }
  if (root.contains("state_file")) config.state_path = get_absolute_path(root["state_file"], "state_file");
  if (root.contains("shutdown_grace_ms"))
    config.shutdown_grace_ms = get_uint(root["shutdown_grace_ms"], "shutdown_grace_ms", 0, 3'600'000);
  if (root.contains("client_defaults"))
    config.client_defaults = parse_limits(root["client_defaults"], "client_defaults", {});
  if (!root.contains("controllers"))
    throw ConfigError{"(top level): missing key \"controllers\"; expected an array of at least one controller"};
  const json& controllers = root["controllers"];
  if (!controllers.is_array() || controllers.empty())
    fail("controllers", controllers, "expected an array of at least one controller");
  std::set<std::string> names, sources;
  std::map<std::pair<dev_t, ino_t>, std::string> images;  // (device, inode) -> the key that named it
  std::map<std::string, std::string> mounts;              // mount point -> the key that named it
  std::size_t i = 0;
  for (const auto& c : controllers) {
    const std::string path = fmt::format("controllers[{}]", i++);
    auto controller = parse_controller(c, path, config.client_defaults);
    if (!names.insert(controller.name).second)
      fail(path + ".name", json(controller.name), "is used by an earlier controller; expected unique names");
    const std::string source = controller.pci_address ? *controller.pci_address : controller.soft->image;
    if (!sources.insert(source).second)
      fail(path + (controller.pci_address ? ".pci_address" : ".soft.image"), json(source),
           "is used by an earlier controller; expected each device once");
    // One image spelled two ways (/x//ns.img, a symlink) is one file: compared by device and inode.
    struct stat image {};
    if (controller.soft && ::stat(controller.soft->image.c_str(), &image) == 0) {
      const auto [earlier, added] = images.emplace(std::pair(image.st_dev, image.st_ino), path + ".soft.image");
      if (!added)
        fail(path + ".soft.image", json(controller.soft->image),
             fmt::format("is the same file as {} (device {}:{}, inode {}); expected each image once", earlier->second,
                         major(image.st_dev), minor(image.st_dev), image.st_ino));
    }
    for (std::size_t k = 0; k < controller.namespaces.size(); ++k) {
      const std::string& point = controller.namespaces[k].mount;
      const std::string key = fmt::format("{}.namespaces[{}].mount", path, k);
      if (point.empty()) continue;
      const auto [earlier, added] = mounts.emplace(fs_normal(point), key);
      if (!added)
        fail(key, json(point),
             fmt::format("is also the mount point of {}; expected one namespace per mount point", earlier->second));
    }
    config.controllers.push_back(std::move(controller));
  }
  return config;
}

}  // namespace

Result<Config> parse_config(std::string_view text, std::string_view origin) {
  json root;
  try {
    root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    return error(StatusCode::INVALID_ARGUMENT, "{}: not valid JSON at byte {}: {}", origin, e.byte, e.what());
  }
  try {
    return parse(root);
  } catch (const ConfigError& e) {
    return error(StatusCode::INVALID_ARGUMENT, "{}: {}", origin, e.message);
  } catch (const json::exception& e) {  // a broken invariant of this parser, not of the input
    return error(StatusCode::INTERNAL, "{}: {}", origin, e.what());
  }
}

Result<Config> load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(StatusCode::NOT_FOUND, "config {}: cannot be read: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path);
}

}  // namespace tutti::daemon
