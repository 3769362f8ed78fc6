// `deepen train BASE --set ... --dry-run` for one job of a study, on the exact arguments the study
// runner passes (in one process: a dry run starts no ranks).
#pragma once

#include <filesystem>
#include <string>

#include "child_process/child_process.h"
#include "study/study_plan.h"
#include "tests/test_paths.h"

namespace deepen::test {

// The dry run's exit code; its output goes to `log` (replaced), its command line to `command`.
inline int study_job_dry_run(const StudyPlan& plan, const StudyJob& job, const std::string& log, std::string& command) {
  ProcessSpec p;
  p.argv = {kDeepenBin, option_name(plan.spec.command), plan.spec.base};
  for (const auto& o : job.overrides) {
    p.argv.push_back("--set");
    p.argv.push_back(o);
  }
  p.argv.push_back("--dry-run");
  p.log_path = log;
  std::filesystem::remove(log);
  command = shell_join(p.argv);
  return run_process(p);
}

}  // namespace deepen::test
