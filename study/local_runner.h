// The local study runner: each job (or teacher group) as a child process, in order, resumable.
#pragma once

#include <cstdint>
#include <string>

#include "child_process/child_process.h"
#include "study/study_plan.h"

namespace deepen {

// The child process of a job: `<deepen> <command> <base> --set ... --quiet?`, wrapped in
// `mpirun --oversubscribe -np <world>` when use_mpirun says so; as root, the OMPI_ALLOW_RUN_AS_ROOT
// pair is added to the environment (Open MPI refuses root otherwise).
struct LaunchContext {
  std::string deepen_exe;   // this binary
  std::string mpirun;       // its path, or "" when there is none
  bool is_root = false;
  bool quiet = false;       // pass --quiet to the runs (no per-step lines)
  // Each run's output goes to <out_dir>/train.log and one progress line per run is kept up to date
  // from its records instead (the demo's view); a failed run's log tail is printed.
  bool log_runs = false;
};

// The last `n` lines of a text file ("" if missing).
std::string tail_lines(const std::string& path, size_t n);
ProcessSpec job_process(const StudyPlan& plan, const StudyJob& job, const LaunchContext& ctx);
// study.teacher = "cache": `<deepen> cache <base> --set ... --out <cache dir> --quiet?`, run before every job.
ProcessSpec cache_process(const StudyPlan& plan, const LaunchContext& ctx);

// The plan as the user sees it before anything runs: one line per job with its layout, curriculum,
// dependency and state on disk, then the order.
std::string describe_plan(const StudyPlan& plan, const LaunchContext& ctx);

// Runs every job in order, skipping finished ones (with study.teacher = "cache", after the cache job). A job whose dependency failed is skipped. Returns
// the exit code for the study: 0 all finished, 3 a run stopped for requeue (the study stops there;
// rerunning the study resumes it), 2 some run had bad input, 1 some run failed.
int run_study(const StudyPlan& plan, const LaunchContext& ctx);

}  // namespace deepen
