// `deepen group FILE`: the runs of a group file trained in one job that shares one teacher pass.
#include <cstdio>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "config/input_error.h"
#include "dist/control/stop_signals.h"
#include "launch/command_line.h"
#include "launch/distributed_job.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "study/group_file.h"
#include "study/teacher_groups.h"

namespace deepen {
namespace {

struct GroupArgs {
  std::string file;
  std::vector<std::string> sets;
  bool dry_run = false;
  bool fresh = false;
  int64_t stop_after = 0;
  bool quiet = false;
  bool print_job = false;
};

}  // namespace

void register_group_command(CLI::App& app) {
  auto o = std::make_shared<GroupArgs>();
  CLI::App* cmd = app.add_subcommand(
      "group", "train the runs of a group file in one job that shares one teacher pass (under mpirun/srun with "
               "T·P + R·S ranks; deepen study writes these files)");
  cmd->add_option("file", o->file, "group file ([group] + [[run]])")->required();
  cmd->add_option("--set", o->sets, "section.key=value, applied to every run after its own overrides");
  cmd->add_flag("--dry-run", o->dry_run, "print the runs and why they may share the teacher, then stop");
  cmd->add_flag("--fresh", o->fresh, "ignore existing checkpoints (default: each run resumes from its newest valid one)");
  cmd->add_option("--stop-after", o->stop_after,
                  "stop every run with a checkpoint after this many optimizer steps (exit code 3, like a preemption)");
  cmd->add_flag("--quiet", o->quiet, "no per-step progress lines");
  cmd->add_flag("--print-job", o->print_job,
                "print one line for slurm/lib.sh and stop: teacher_pipelines teacher_stages students runs "
                "rank_order out_dir run.device parallel.backend (of run 0)");
  cmd->callback([o] {
    control::catch_early_stop_signals();
    const GroupSpec group = load_group_file(o->file);
    const std::vector<Config> runs = load_group_configs(group, o->sets);
    for (size_t r = 1; r < runs.size(); ++r)
      if (auto why = teacher_share_difference(runs.front(), runs[r]))
        throw InputError(o->file + ": run " + std::to_string(r) + " (" + runs[r].run.name +
                         ") cannot share the teacher with run 0 (" + runs.front().run.name + "): " + *why);
    if (o->print_job) {
      const Config& c = runs.front();
      const ParallelConfig& p = c.parallel;
      std::cout << p.teacher_pipelines << " " << p.teacher_stages << " " << p.students << " " << runs.size() << " "
                << option_name(p.rank_order) << " " << group.out_dir << " " << option_name(c.run.device) << " "
                << option_name(p.backend) << "\n";
      return;
    }
    if (o->dry_run) {
      const ParallelConfig& p = runs.front().parallel;
      std::cout << "group " << group.name << " (" << group.out_dir << "): " << runs.size() << " runs share one teacher; "
                << "world = " << p.teacher_pipelines << " x " << p.teacher_stages << " + " << runs.size() << " x "
                << p.students << " = " << p.teacher_pipelines * p.teacher_stages + int64_t(runs.size()) * p.students
                << " ranks\n";
      for (size_t r = 0; r < runs.size(); ++r)
        std::cout << "  run " << r << ": " << runs[r].run.name << " -> " << runs[r].run.out_dir << "\n";
      // The teacher's memory is the group's: its last stage keeps up to max_in_flight payloads per
      // run whose micro-batches differ (plan/memory_model.h).
      try {
        PlanInput in = plan_input_from_config(runs.front());
        const TeacherStageMemory one = planned_teacher_stage(in, p.teacher_stages);
        in.shared_runs = static_cast<int64_t>(runs.size());
        const TeacherStageMemory all = planned_teacher_stage(in, p.teacher_stages);
        std::printf("  teacher stage (the largest, deepen plan's model): %.2f GiB with %zu runs' outgoing queues "
                    "(%.2f GiB for one run's)\n", all.total() / 1073741824.0, runs.size(), one.total() / 1073741824.0);
      } catch (const InputError& e) {
        std::cout << "  teacher stage: not planned (" << e.what() << ")\n";
      }
      return;
    }
    JobOptions job;
    job.resume = !o->fresh;
    if (o->stop_after > 0) job.stop_after_steps = o->stop_after;
    job.print_progress = !o->quiet;
    job.group_file = o->file;
    const int rc = run_shared_teacher_job(runs, group.out_dir, job);
    if (rc != kExitOk) throw ExitRequest(rc);
  });
}

}  // namespace deepen
