// Command-line pieces every subcommand shares: config file, --set overrides, --dry-run.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/config.h"

namespace deepen {

struct ConfigOptions {
  std::string path;                  // TOML file (positional)
  std::vector<std::string> sets;     // --set section.key=value, applied in order after the file
  bool dry_run = false;              // print the resolved config (and layout) and stop
};

// Adds `CONFIG`, `--set` and `--dry-run` to a subcommand.
void add_config_options(CLI::App& cmd, ConfigOptions& opts);

// Loads and validates; on --dry-run prints the resolved config to stdout.
Config load_config(const ConfigOptions& opts);

// Each subcommand lives in its own launch/cmd_*.cpp and registers itself on the app.
void register_inspect_command(CLI::App& app);
void register_forward_command(CLI::App& app);
void register_export_command(CLI::App& app);
// The two training commands return their subcommand: main keeps early stop signals for them only.
CLI::App* register_train_command(CLI::App& app);     // cmd_train.cpp
CLI::App* register_pretrain_command(CLI::App& app);  // cmd_train.cpp
void register_study_command(CLI::App& app);     // cmd_study.cpp
void register_group_command(CLI::App& app);     // cmd_group.cpp
void register_report_command(CLI::App& app);    // cmd_report.cpp
void register_plan_command(CLI::App& app);      // cmd_plan.cpp
void register_demo_command(CLI::App& app);      // cmd_demo.cpp
void register_prep_command(CLI::App& app);      // cmd_prep.cpp
void register_tokenize_command(CLI::App& app);  // cmd_tokenize.cpp
void register_cache_command(CLI::App& app);     // cmd_cache.cpp

}  // namespace deepen
