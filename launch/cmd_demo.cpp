// `deepen demo`: the CPU study end to end (corpus, teacher, four runs, report) in one command.
#include <cstdlib>
#include <memory>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "launch/command_line.h"
#include "study/demo.h"

namespace deepen {

void register_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  auto verbose = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "demo", "CPU study end to end: prep a corpus, pretrain a small teacher, run pre/post x joint/grow, report");
  cmd->add_option("--out", o->out_dir, "output folder (default runs/demo, runs/demo-small with --small)");
  cmd->add_flag("--small", o->small, "the reduced demo (a minute or two; what the test runs)");
  cmd->add_option("--study", o->study,
                  "a study of demo.toml's [studies] instead of the 2 x 2: norm-growth (placements pre, post, peri, "
                  "mix x joint, grow x growth operators teacher, identity x 3 seeds: 48 runs, 4.8 x the 2 x 2's work)");
  cmd->add_option("--configs", o->configs, "folder holding demo.toml (default: configs/demo of this checkout)");
  auto launcher = std::make_shared<std::string>();
  cmd->add_option("--launcher", *launcher, "auto | mpirun | direct: how each student run starts (default: the study's)");
  cmd->add_flag("--verbose", *verbose, "show every run's own output instead of one progress line per run");
  cmd->callback([o, verbose, launcher] {
    if (std::getenv("DEEPEN_DEMO_SMALL")) o->small = true;
    if (!launcher->empty()) o->launcher = parse_option<Launcher>(*launcher, "--launcher");
    o->log_runs = !*verbose;
    const int rc = run_demo(*o);
    if (rc != kExitOk) throw ExitRequest(rc);
  });
}

}  // namespace deepen
