// Shared command-line options: config file, overrides, dry run.
#include "launch/command_line.h"

#include <iostream>

namespace deepen {

void add_config_options(CLI::App& cmd, ConfigOptions& opts) {
  cmd.add_option("config", opts.path, "TOML config file")->required();
  cmd.add_option("--set", opts.sets, "override one key: section.key=value (TOML value), repeatable")
      ->take_all();
  cmd.add_flag("--dry-run", opts.dry_run, "print the resolved config and exit");
}

Config load_config(const ConfigOptions& opts) {
  Config cfg = load_config(opts.path, opts.sets);
  if (opts.dry_run) std::cout << "# resolved config (" << cfg.source << ")\n" << to_toml(cfg);
  return cfg;
}

}  // namespace deepen
