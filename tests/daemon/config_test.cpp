// tuttid's configuration parser (daemon/src/config.hpp): every error case names the key path, the value and
// what was expected; a valid file with comments parses; the defaults are pinned.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <tutti/libnvm/soft_controller.hpp>

#include "config.hpp"
#include "require_ok.hpp"

namespace {

using tutti::StatusCode;
using tutti::daemon::parse_config;

// A valid controller object, spliced into the cases below.
constexpr const char* kSoft = R"({"name": "soft0", "soft": {"image": "/var/lib/tutti/soft0.img"}})";

std::string with_controllers(const std::string& controllers) {
  return std::string(R"({"controllers": [)") + controllers + "]}";
}
std::string with_controller_keys(const std::string& keys) {
  return with_controllers(R"({"name": "soft0", "soft": {"image": "/i.img"}, )" + keys + "}");
}

struct Case {
  const char* what;
  std::string text;
  std::vector<std::string> expected;  // substrings of the message, in any order
};

}  // namespace

TEST_CASE("every configuration error names the key path, the value and what was expected") {
  const std::vector<Case> cases = {
      {"not JSON", "{\"controllers\": [", {"not valid JSON at byte"}},
      {"trailing garbage", std::string(with_controllers(kSoft)) + " x", {"not valid JSON"}},
      {"top level not an object", "[]", {"(top level)", "[]", "expected an object"}},
      {"unknown top-level key",
       R"({"sockets": {}, "controllers": [)" + std::string(kSoft) + "]}",
       {"unknown key \"sockets\"", "expected one of", "socket"}},
      {"no controllers", "{}", {"missing key \"controllers\""}},
      {"controllers empty", with_controllers(""), {"controllers", "[]", "at least one controller"}},
      {"controllers not an array", R"({"controllers": {}})", {"controllers", "{}", "expected an array"}},
      {"controller not an object", with_controllers("3"), {"controllers[0]", "3", "expected an object"}},
      {"controller without name",
       with_controllers(R"({"soft": {"image": "/i"}})"),
       {"controllers[0]", "missing key \"name\""}},
      {"controller name not a string",
       with_controllers(R"({"name": 7, "soft": {"image": "/i"}})"),
       {"controllers[0].name", "7", "expected a string"}},
      {"controller name with capitals",
       with_controllers(R"({"name": "Soft 0", "soft": {"image": "/i"}})"),
       {"controllers[0].name", "\"Soft 0\"", "[a-z0-9_-]"}},
      {"both pci_address and soft",
       with_controllers(R"({"name": "a", "soft": {"image": "/i"}, "pci_address": "0000:01:00.0"})"),
       {"controllers[0]", "both", "exactly one of"}},
      {"neither pci_address nor soft",
       with_controllers(R"({"name": "a"})"),
       {"controllers[0]", "neither", "exactly one of"}},
      {"malformed PCI address",
       with_controllers(R"({"name": "a", "pci_address": "01:00.0"})"),
       {"controllers[0].pci_address", "\"01:00.0\"", "DDDD:BB:DD.F"}},
      {"PCI function above 7",
       with_controllers(R"({"name": "a", "pci_address": "0000:01:00.8"})"),
       {"controllers[0].pci_address", "0000:01:00.8"}},
      {"soft without image",
       with_controllers(R"({"name": "a", "soft": {}})"),
       {"controllers[0].soft", "missing key \"image\""}},
      {"soft image relative",
       with_controllers(R"({"name": "a", "soft": {"image": "x.img"}})"),
       {"controllers[0].soft.image", "\"x.img\"", "absolute path"}},
      {"soft not an object",
       with_controllers(R"({"name": "a", "soft": "x"})"),
       {"controllers[0].soft", "\"x\"", "expected an object"}},
      {"soft unknown key",
       with_controllers(R"({"name": "a", "soft": {"image": "/i", "size": 3}})"),
       {"controllers[0].soft", "unknown key \"size\"", "image, lba_size, max_queue_entries"}},
      {"lba_size 1024",
       with_controllers(R"({"name": "a", "soft": {"image": "/i", "lba_size": 1024}})"),
       {"controllers[0].soft.lba_size", "1024", "512 or 4096"}},
      {"max_queue_entries 1",
       with_controllers(R"({"name": "a", "soft": {"image": "/i", "max_queue_entries": 1}})"),
       {"controllers[0].soft.max_queue_entries", "1", "[2, 65536]"}},
      {"io_queue_pairs 0",
       with_controller_keys(R"("io_queue_pairs": 0)"),
       {"controllers[0].io_queue_pairs", "0", "[1, 65535]"}},
      {"io_queue_pairs not an integer",
       with_controller_keys(R"("io_queue_pairs": 1.5)"),
       {"controllers[0].io_queue_pairs", "1.5", "not an integer"}},
      {"io_queue_pairs negative",
       with_controller_keys(R"("io_queue_pairs": -2)"),
       {"controllers[0].io_queue_pairs", "-2", "not an integer"}},
      {"kernel_queues leave nothing",
       with_controller_keys(R"("io_queue_pairs": 4, "kernel_queues": 4)"),
       {"controllers[0]", "kernel_queues 4", "io_queue_pairs 4", "expected kernel_queues < io_queue_pairs"}},
      {"queue_depth 1", with_controller_keys(R"("queue_depth": 1)"), {"controllers[0].queue_depth", "1", "[2, 65536]"}},
      {"queue_depth above MQES",
       with_controllers(R"({"name": "a", "soft": {"image": "/i", "max_queue_entries": 64}, "queue_depth": 128})"),
       {"controllers[0]", "queue_depth 128", "soft.max_queue_entries 64"}},
      {"namespaces not an array",
       with_controller_keys(R"("namespaces": {})"),
       {"controllers[0].namespaces", "{}", "expected an array"}},
      {"namespace unknown key",
       with_controller_keys(R"("namespaces": [{"nsid": 1, "mnt": "/m"}])"),
       {"controllers[0].namespaces[0]", "unknown key \"mnt\"", "nsid, mount, filesystem"}},
      {"namespace nsid 0",
       with_controller_keys(R"("namespaces": [{"nsid": 0}])"),
       {"controllers[0].namespaces[0].nsid", "0"}},
      {"duplicate nsid",
       with_controller_keys(R"("namespaces": [{"nsid": 1}, {"nsid": 1}])"),
       {"controllers[0].namespaces[1].nsid", "1", "unique NSIDs"}},
      {"relative mount",
       with_controller_keys(R"("namespaces": [{"mount": "mnt/kv"}])"),
       {"controllers[0].namespaces[0].mount", "\"mnt/kv\"", "absolute path"}},
      {"unsupported filesystem",
       with_controller_keys(R"("namespaces": [{"filesystem": "btrfs"}])"),
       {"controllers[0].namespaces[0].filesystem", "\"btrfs\"", "\"ext4\" or \"xfs\""}},
      {"allow not an object",
       with_controller_keys(R"("allow": ["root"])"),
       {"controllers[0].allow", "[\"root\"]", "expected an object"}},
      {"allow unknown key",
       with_controller_keys(R"("allow": {"user": ["root"]})"),
       {"controllers[0].allow", "unknown key \"user\"", "users, groups"}},
      {"allow.users not an array",
       with_controller_keys(R"("allow": {"users": "root"})"),
       {"controllers[0].allow.users", "\"root\"", "expected an array"}},
      {"unknown user",
       with_controller_keys(R"("allow": {"users": ["root", "no-such-user-xq"]})"),
       {"controllers[0].allow.users[1]", "\"no-such-user-xq\"", "not a user of this host"}},
      {"unknown group",
       with_controller_keys(R"("allow": {"groups": ["no-such-group-xq"]})"),
       {"controllers[0].allow.groups[0]", "\"no-such-group-xq\"", "not a group of this host"}},
      {"negative uid",
       with_controller_keys(R"("allow": {"users": [-1]})"),
       {"controllers[0].allow.users[0]", "-1", "not an integer"}},
      {"user entry of another type",
       with_controller_keys(R"("allow": {"users": [true]})"),
       {"controllers[0].allow.users[0]", "true", "expected a string"}},
      {"accelerators not an array",
       with_controller_keys(R"("accelerators": 0)"),
       {"controllers[0].accelerators", "0", "expected an array"}},
      {"accelerator ordinal too large",
       with_controller_keys(R"("accelerators": [0, 2000])"),
       {"controllers[0].accelerators[1]", "2000", "[0, 1023]"}},
      {"client default_queues above max_queues",
       with_controller_keys(R"("client": {"default_queues": 3, "max_queues": 2})"),
       {"controllers[0].client", "default_queues 3", "max_queues 2"}},
      {"client default_pinned_bytes above max",
       with_controller_keys(R"("client": {"default_pinned_bytes": 10, "max_pinned_bytes": 5})"),
       {"controllers[0].client", "default_pinned_bytes 10", "max_pinned_bytes 5"}},
      {"client max_queues above leasable queues",
       with_controller_keys(R"("io_queue_pairs": 4, "kernel_queues": 1, "client": {"max_queues": 4})"),
       {"controllers[0]", "client.max_queues 4", "3 leasable queues", "expected at most 3"}},
      {"client unknown key",
       with_controller_keys(R"("client": {"queues": 1})"),
       {"controllers[0].client", "unknown key \"queues\""}},
      {"client max_queues 0",
       with_controller_keys(R"("client": {"max_queues": 0})"),
       {"controllers[0].client.max_queues", "0", "[1, 65535]"}},
      {"controller unknown key",
       with_controller_keys(R"("queues": 3)"),
       {"controllers[0]", "unknown key \"queues\"", "pci_address"}},
      {"duplicate controller names",
       with_controllers(std::string(kSoft) + R"(, {"name": "soft0", "soft": {"image": "/other.img"}})"),
       {"controllers[1].name", "\"soft0\"", "unique names"}},
      {"one image twice",
       with_controllers(std::string(kSoft) + R"(, {"name": "soft1", "soft": {"image": "/var/lib/tutti/soft0.img"}})"),
       {"controllers[1].soft.image", "soft0.img", "each device once"}},
      {"one PCI address twice",
       with_controllers(
           R"({"name": "a", "pci_address": "0000:01:00.0"}, {"name": "b", "pci_address": "0000:01:00.0"})"),
       {"controllers[1].pci_address", "0000:01:00.0", "each device once"}},
      {"socket not an object",
       R"({"socket": "/run/x", "controllers": [)" + std::string(kSoft) + "]}",
       {"socket", "\"/run/x\"", "expected an object"}},
      {"socket unknown key",
       R"({"socket": {"owner": "root"}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket", "unknown key \"owner\"", "path, mode, group"}},
      {"socket.path relative",
       R"({"socket": {"path": "tuttid.sock"}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket.path", "\"tuttid.sock\"", "absolute path"}},
      {"socket.path too long",
       R"({"socket": {"path": "/)" + std::string(120, 'a') + R"("}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket.path", "too long for a Unix socket", "at most 107 bytes"}},
      {"socket.mode open to others",
       R"({"socket": {"mode": "0666"}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket.mode", "\"0666\"", "without permissions for others"}},
      {"socket.mode not octal text",
       R"({"socket": {"mode": "660"}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket.mode", "\"660\"", "e.g. \"0660\""}},
      {"socket.mode a number",
       R"({"socket": {"mode": 432}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket.mode", "432", "expected a string"}},
      {"socket.group unknown",
       R"({"socket": {"group": "no-such-group-xq"}, "controllers": [)" + std::string(kSoft) + "]}",
       {"socket.group", "\"no-such-group-xq\"", "not a group of this host"}},
      {"state_file not a string",
       R"({"state_file": 1, "controllers": [)" + std::string(kSoft) + "]}",
       {"state_file", "1", "expected a string"}},
      {"shutdown_grace_ms too large",
       R"({"shutdown_grace_ms": 3600001, "controllers": [)" + std::string(kSoft) + "]}",
       {"shutdown_grace_ms", "3600001", "[0, 3600000]"}},
      {"shutdown_grace_ms text",
       R"({"shutdown_grace_ms": "5s", "controllers": [)" + std::string(kSoft) + "]}",
       {"shutdown_grace_ms", "\"5s\"", "not an integer"}},
      {"client_defaults not an object",
       R"({"client_defaults": 4, "controllers": [)" + std::string(kSoft) + "]}",
       {"client_defaults", "4", "expected an object"}},
      {"client_defaults inconsistent",
       R"({"client_defaults": {"max_queues": 1, "default_queues": 2}, "controllers": [)" + std::string(kSoft) + "]}",
       {"client_defaults", "default_queues 2", "max_queues 1"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    auto config = parse_config(c.text, "test.json");
    REQUIRE_FALSE(config.is_ok());
    CHECK(config.code() == StatusCode::INVALID_ARGUMENT);
    const std::string message = config.status().message();
    CAPTURE(message);
    CHECK(message.starts_with("test.json: "));
    for (const auto& part : c.expected) CHECK_MESSAGE(message.find(part) != std::string::npos, "missing: " << part);
  }
}

TEST_CASE("a full configuration with comments parses, and every key lands where it should") {
  const char* text = R"(
    // tuttid.json
    {
      "socket": {"path": "/tmp/t.sock", "mode": "0600", "group": "root"},
      "state_file": "/tmp/t.state",
      "shutdown_grace_ms": 250,  /* short, for tests */
      "client_defaults": {"default_queues": 2, "max_queues": 3, "default_pinned_bytes": 4096, "max_pinned_bytes": 8192},
      "controllers": [
        {"name": "soft0", "soft": {"image": "/a.img", "lba_size": 512, "max_queue_entries": 128},
         "io_queue_pairs": 8, "kernel_queues": 2, "queue_depth": 64,
         "namespaces": [{"nsid": 1, "mount": "/mnt/kv0"}, {"nsid": 2, "mount": "/mnt/kv1", "filesystem": "xfs"}],
         "allow": {"users": ["root", 4242], "groups": ["root"]}, "accelerators": [0, 3]},
        {"name": "nvme1", "pci_address": "0000:c1:00.0", "client": {"max_queues": 6}}
      ]
    })";
  auto config = tutti::testing::require_ok(parse_config(text));
  CHECK(config.socket_path == "/tmp/t.sock");
  CHECK(config.socket_mode == 0600);
  CHECK(config.socket_gid == gid_t{0});
  CHECK(config.state_path == "/tmp/t.state");
  CHECK(config.shutdown_grace_ms == 250);
  REQUIRE(config.controllers.size() == 2);
  const auto& a = config.controllers[0];
  CHECK(a.name == "soft0");
  REQUIRE(a.soft.has_value());
  CHECK(a.soft->image == "/a.img");
  CHECK(a.soft->lba_size == 512);
  CHECK(a.soft->max_queue_entries == 128);
  CHECK(a.io_queue_pairs == 8);
  CHECK(a.kernel_queues == 2);
  CHECK(a.leasable_queues() == 6);
  CHECK(a.queue_depth == 64);
  REQUIRE(a.namespaces.size() == 2);
  CHECK(a.namespaces[1].nsid == 2);
  CHECK(a.namespaces[1].mount == "/mnt/kv1");
  CHECK(a.namespaces[1].filesystem == "xfs");
  CHECK(a.allowed_uids == std::vector<uid_t>{0, 4242});
  CHECK(a.allowed_gids == std::vector<gid_t>{0});
  CHECK(a.accelerators == std::vector<std::uint32_t>{0, 3});
  CHECK(a.client.default_queues == 2);  // from client_defaults
  CHECK(a.client.max_queues == 3);
  CHECK(a.client.max_pinned_bytes == 8192);
  const auto& b = config.controllers[1];
  CHECK(b.pci_address == std::optional<std::string>("0000:c1:00.0"));
  CHECK(b.client.max_queues == 6);      // its own
  CHECK(b.client.default_queues == 2);  // the rest from client_defaults
}

TEST_CASE("the defaults are the documented ones") {
  auto config = tutti::testing::require_ok(parse_config(with_controllers(kSoft)));
  CHECK(config.socket_path == "/run/tutti/tuttid.sock");
  CHECK(config.socket_mode == 0660);
  CHECK_FALSE(config.socket_gid.has_value());
  CHECK(config.state_path == "/run/tutti/tuttid.state");
  CHECK(config.shutdown_grace_ms == 5000);
  const auto& c = config.controllers[0];
  CHECK(c.io_queue_pairs == 16);
  CHECK(c.kernel_queues == 1);
  CHECK(c.queue_depth == 256);
  CHECK(c.soft->lba_size == 4096);
  CHECK(c.soft->max_queue_entries == 1024);
  CHECK(c.client.default_queues == 1);
  CHECK(c.client.max_queues == 4);
  CHECK(c.client.default_pinned_bytes == 256ull << 20);
  CHECK(c.client.max_pinned_bytes == 4ull << 30);
  CHECK(c.allowed_uids.empty());
  CHECK(tutti::daemon::kDefaultConfigPath == "/etc/tutti/tuttid.json");
  // The soft controller's shared memory mode, which tuttid turns on, is off by default (docs/nvme.md).
  CHECK(tutti::libnvm::kSoftDefaultSharedMemory == false);
  CHECK(tutti::libnvm::SoftControllerConfig{}.shared_memory == tutti::libnvm::kSoftDefaultSharedMemory);
}

TEST_CASE("load_config names a file it cannot read, and the file in every parse error") {
  auto missing = tutti::daemon::load_config("/nonexistent/tuttid.json");
  CHECK(missing.code() == StatusCode::NOT_FOUND);
  CHECK(missing.status().message().find("/nonexistent/tuttid.json") != std::string::npos);
  const auto path = std::filesystem::temp_directory_path() / ("tuttid-config-" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << R"({"controllers": [{"name": "x", "soft": {"image": "/i"}, "io_queue_pairs": "many"}]})";
  }
  auto bad = tutti::daemon::load_config(path.string());
  std::filesystem::remove(path);
  CHECK(bad.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(bad.status().message().find(path.string() + ": controllers[0].io_queue_pairs: \"many\"") != std::string::npos);
}

TEST_CASE("one image spelled two ways (a doubled slash, a symlink) is refused, naming both controllers' keys") {
  const auto dir = std::filesystem::temp_directory_path() / ("tuttid-config-images-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Remove {
    std::filesystem::path dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{dir};
  { std::ofstream(dir / "ns.img") << "image"; }
  std::filesystem::create_symlink(dir / "ns.img", dir / "link.img");
  for (const std::string& other : {dir.string() + "//ns.img", (dir / "link.img").string()}) {
    CAPTURE(other);
    auto config = parse_config(with_controllers(R"({"name": "a", "soft": {"image": ")" + (dir / "ns.img").string() +
                                                R"("}}, {"name": "b", "soft": {"image": ")" + other + R"("}})"),
                               "test.json");
    REQUIRE_FALSE(config.is_ok());
    const std::string message = config.status().message();
    CAPTURE(message);
    CHECK(message.find("controllers[1].soft.image: \"" + other + "\" is the same file as controllers[0].soft.image") !=
          std::string::npos);
    CHECK(message.find("expected each image once") != std::string::npos);
  }
}

TEST_CASE("a mount point is one namespace's: a second one, spelled with a trailing slash, names the first") {
  auto config =
      parse_config(with_controllers(
                       R"({"name": "a", "soft": {"image": "/a.img"}, "namespaces": [{"nsid": 1, "mount": "/mnt/kv0/"}]},
             {"name": "b", "soft": {"image": "/b.img"}, "namespaces": [{"nsid": 1, "mount": "/mnt//kv0"}]})"),
                   "test.json");
  REQUIRE_FALSE(config.is_ok());
  const std::string message = config.status().message();
  CAPTURE(message);
  CHECK(message.find("controllers[1].namespaces[0].mount: \"/mnt//kv0\" is also the mount point of "
                     "controllers[0].namespaces[0].mount") != std::string::npos);
  auto one = parse_config(with_controllers(
      R"({"name": "a", "soft": {"image": "/a.img"}, "namespaces": [{"nsid": 1, "mount": "/mnt/kv0//"}]})"));
  REQUIRE(one.is_ok());
  CHECK(one->controllers[0].namespaces[0].mount == "/mnt/kv0");
}

TEST_CASE("the shipped example configuration is valid") {
  const char* source = std::getenv("TUTTI_SOURCE_ROOT");
  REQUIRE(source != nullptr);
  auto config = tutti::daemon::load_config(std::string(source) + "/daemon/tuttid.example.json");
  CHECK_MESSAGE(config.is_ok(), config.status().to_string());
}
