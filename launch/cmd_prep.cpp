// `deepen prep CONFIG`: tokenizes data.sources into train/valid token shards (see data/prep.h).
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "data/prep.h"
#include "launch/command_line.h"

namespace deepen {

void register_prep_command(CLI::App& app) {
  struct PrepCommand {
    ConfigOptions config;
    PrepOptions prep;
    bool no_progress = false;
  };
  auto opts = std::make_shared<PrepCommand>();
  CLI::App* cmd = app.add_subcommand(
      "prep", "tokenize data.sources (text files, folders, JSONL, parquet) into data.train / data.valid token shards");
  add_config_options(*cmd, opts->config);
  cmd->add_option("--threads", opts->prep.threads, "tokenizer threads (default: every core)");
  cmd->add_flag("--overwrite", opts->prep.overwrite, "replace shards already in the output folders");
  cmd->add_flag("--no-progress", opts->no_progress, "no progress bar (it is shown only on a terminal anyway)");
  cmd->callback([opts] {
    const Config cfg = load_config(opts->config);
    if (opts->config.dry_run) return;
    if (opts->no_progress) opts->prep.progress = 0;
    const PrepSummary sum = run_prep(cfg.data, opts->prep);
    std::cout << sum.line() << "\n";
  });
}

}  // namespace deepen
