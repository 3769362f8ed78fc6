// `deepen train` (distillation) and `deepen pretrain` (CE only: the demo teacher and the no-teacher
// baseline), single process.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "dist/control/stop_signals.h"
#include "launch/command_line.h"
#include "launch/distributed_job.h"
#include "launch/local_job.h"

namespace deepen {
namespace {

struct TrainCommand {
  ConfigOptions config;
  bool fresh = false;
  int64_t stop_after = 0;
  bool quiet = false;
};

CLI::App* add_training_command(CLI::App& app, const char* name, const char* help, bool distill) {
  auto opts = std::make_shared<TrainCommand>();
  CLI::App* cmd = app.add_subcommand(name, help);
  add_config_options(*cmd, opts->config);
  cmd->add_flag("--fresh", opts->fresh,
                "ignore existing checkpoints in run.out_dir (default: resume from the newest valid one)");
  cmd->add_option("--stop-after", opts->stop_after,
                  "stop with a checkpoint after this many optimizer steps (exit code 3, like a preemption)");
  cmd->add_flag("--quiet", opts->quiet, "no per-step progress lines");
  cmd->callback([opts, distill] {
    // A stop signal is kept until the control plane can turn it into a coordinated stop, instead
    // of killing a rank that is still starting (main installed the handler before LibTorch loaded;
    // this keeps it for callers of the command that did not go through main, such as tests).
    control::catch_early_stop_signals();
    const Config cfg = load_config(opts->config);
    if (opts->config.dry_run) {
      control::release_early_stop_signals();  // nothing runs that could act on one
      return;
    }
    JobOptions job;
    job.resume = !opts->fresh;
    if (opts->stop_after > 0) job.stop_after_steps = opts->stop_after;
    job.print_progress = !opts->quiet;
    // Under mpirun/srun with several ranks, `train` runs the distributed layout of [parallel];
    // alone, it runs the same global batch in one process.
    const int rc = !distill                         ? run_pretrain_job(cfg, job)
                   : launched_with_several_ranks() ? run_distributed_train_job(cfg, job)
                                                   : run_train_job(cfg, job);
    if (rc != kExitOk) throw ExitRequest(rc);
  });
  return cmd;
}

}  // namespace

CLI::App* register_train_command(CLI::App& app) {
  return add_training_command(app, "train", "distil the teacher into the growing student (single process)", true);
}

CLI::App* register_pretrain_command(CLI::App& app) {
  return add_training_command(app, "pretrain", "train a model on next-token CE alone (the demo teacher, baselines)", false);
}

}  // namespace deepen
