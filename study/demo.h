// `deepen demo`: the CPU study end to end — prep a corpus, pretrain a small teacher, run the four core
// runs (pre/post-norm x joint/grow) as a study, write the report — driven by configs/demo/demo.toml.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace deepen {

struct DemoOptions {
  std::string out_dir;     // "" = runs/demo (runs/demo-small with `small`)
  bool small = false;      // the reduced demo of demo.toml's [small] (the test runs it)
  // A study of demo.toml's [studies] instead of the 2 x 2 ("norm-growth": placements x curriculum x
  // growth operators). It shares the corpus and the teacher of the same --out; its runs go to
  // <out>/<name>, its report to <out>/<name>-report.
  std::string study;
  std::string configs;     // folder holding demo.toml; "" = configs/demo of this checkout
  std::optional<Launcher> launcher;  // unset = the study file's; kDirect runs every student run in one process
  bool log_runs = true;    // runs' output to their train.log, one progress line each on the terminal
};

// What demo.toml says, with paths resolved against its folder.
struct DemoPlan {
  std::string teacher_config;               // pretrain config; its [data] also drives prep
  std::string study;                        // study file
  std::vector<std::string> prep_sets;       // extra overrides for prep (small)
  std::vector<std::string> teacher_sets;    // extra overrides for the teacher (small)
};

// Reads <configs>/demo.toml (InputError naming file and key); `study` (may be empty) names an entry of
// its [studies] table, which replaces the study file (InputError listing the names for an unknown one).
DemoPlan load_demo_plan(const std::string& configs_dir, bool small, const std::string& study = "");

// configs/demo of the checkout holding this binary (<exe>/../../configs/demo), else of the working
// directory; "" if neither exists.
std::string find_demo_configs(const std::string& deepen_exe);

// Runs the demo; every step is skipped when its output is already complete, so an interrupted demo
// continues where it stopped. Returns the exit code (0 when the report was written).
int run_demo(const DemoOptions& options);

}  // namespace deepen
