// tuttid: owns the NVMe controllers of this host and leases their I/O queues to client processes
// (docs/daemon.md).   tuttid [--config /etc/tutti/tuttid.json] [--check]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "config.hpp"
#include "server.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tuttid: owns the NVMe controllers and leases their queues to processes (docs/daemon.md)"};
  std::string config_path{tutti::daemon::kDefaultConfigPath};
  bool check = false;
  app.add_option("--config", config_path, "configuration file (JSON with comments)")->capture_default_str();
  app.add_flag("--check", check, "validate the configuration and exit (0: valid)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad flag or value: 2, as a bad configuration
  }
  auto config = tutti::daemon::load_config(config_path);
  if (!config) {
    std::fprintf(stderr, "tuttid: %s\n", config.status().to_string().c_str());
    return 2;
  }
  if (check) {
    std::printf("tuttid: %s is valid (%zu controllers)\n", config_path.c_str(), config->controllers.size());
    return 0;
  }
  tutti::Status status = tutti::daemon::run_daemon(*config, stderr);
  if (!status.is_ok()) {
    std::fprintf(stderr, "tuttid: %s\n", status.to_string().c_str());
    return 1;
  }
  return 0;
}
