// `deepen study FILE`: expand a study into run folders and run it locally, or write Slurm scripts.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "launch/command_line.h"
#include "study/local_runner.h"
#include "study/slurm_study.h"

namespace deepen {
namespace {

struct StudyArgs {
  std::string file;
  std::string out;
  std::vector<std::string> sets;
  std::vector<std::string> only;
  std::string slurm_dir;
  std::string launcher;
  SlurmOptions slurm;
  bool dry_run = false;
  bool quiet = false;
  bool share_teacher = false;
  std::optional<int64_t> max_group_runs;
  bool log = false;
};

}  // namespace

void register_study_command(CLI::App& app) {
  auto o = std::make_shared<StudyArgs>();
  CLI::App* cmd = app.add_subcommand("study", "run a study (base config + named runs x seeds), or write its Slurm array");
  cmd->add_option("file", o->file, "study TOML file ([study] + [[run]])")->required();
  cmd->add_option("--out", o->out, "output folder (overrides study.out_dir)");
  cmd->add_option("--set", o->sets, "override for every run: section.key=value (after the study's own)")->take_all();
  cmd->add_option("--only", o->only, "run only these runs (all their seeds); repeatable");
  cmd->add_option("--launcher", o->launcher, "override study.launcher: auto | mpirun | direct");
  cmd->add_flag("--share-teacher", o->share_teacher,
                "set study.share_teacher: runs whose teacher inputs are equal train as one job (docs/study.md)");
  cmd->add_option("--max-group-runs", o->max_group_runs, "set study.max_group_runs: at most this many runs per shared teacher");
  cmd->add_flag("--dry-run", o->dry_run, "print the plan (runs, seeds, layout, order) and stop");
  cmd->add_flag("--quiet", o->quiet, "no per-step progress lines from the runs");
  cmd->add_flag("--log", o->log, "send each run's output to <run>/train.log and show one progress line per run");
  cmd->add_option("--slurm", o->slurm_dir, "write Slurm scripts (array + dependencies) into this folder instead of running");
  cmd->add_option("--gpus-per-node", o->slurm.gpus_per_node, "Slurm: GPUs (= tasks) per node")->capture_default_str();
  cmd->add_option("--partition", o->slurm.partition, "Slurm: partition");
  cmd->add_option("--account", o->slurm.account, "Slurm: account");
  cmd->add_option("--time", o->slurm.time, "Slurm: time limit per run (runs requeue themselves)")->capture_default_str();
  cmd->add_option("--cpus-per-task", o->slurm.cpus_per_task, "Slurm: CPU cores per rank")->capture_default_str();
  cmd->add_option("--deepen-bin", o->slurm.deepen_exe, "Slurm: deepen binary on the cluster (default: this one)");
  cmd->add_option("--deepen-home", o->slurm.deepen_home, "Slurm: checkout holding slurm/study_array.sbatch (default: found from the binary)");
  cmd->callback([o] {
    StudySpec spec = load_study(o->file);
    if (!o->out.empty()) spec.out_dir = o->out;
    if (!o->launcher.empty()) spec.launcher = parse_option<Launcher>(o->launcher, "--launcher");
    if (o->share_teacher) spec.share_teacher = true;
    if (o->max_group_runs) {
      if (*o->max_group_runs < 0) throw InputError("--max-group-runs: expected an integer >= 0 (0 = no cap)");
      spec.max_group_runs = *o->max_group_runs;
    }
    const StudyPlan plan = expand_study(spec, o->sets, o->only);
    LaunchContext ctx;
    ctx.deepen_exe = self_executable();
    ctx.mpirun = find_in_path("mpirun");
    ctx.is_root = ::geteuid() == 0;
    ctx.quiet = o->quiet;
    ctx.log_runs = o->log;
    std::cout << describe_plan(plan, ctx) << std::flush;
    if (!o->slurm_dir.empty()) {
      if (o->slurm.deepen_exe.empty()) o->slurm.deepen_exe = ctx.deepen_exe;
      if (o->slurm.deepen_home.empty()) o->slurm.deepen_home = find_deepen_home(ctx.deepen_exe);
      o->slurm.workdir = std::filesystem::current_path().string();
      if (o->dry_run) return;
      write_slurm_study(plan, o->slurm, o->slurm_dir);
      std::cout << "study: wrote " << o->slurm_dir << "/{submit.sh,study.list}; submit with "
                << o->slurm_dir << "/submit.sh\n";
      return;
    }
    if (o->dry_run) return;
    const int rc = run_study(plan, ctx);
    if (rc != kExitOk) throw ExitRequest(rc);
  });
}

}  // namespace deepen
