// A study on Slurm: the array list, the group files and submit.sh that slurm/study_array.sbatch runs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "study/study_plan.h"

namespace deepen {

// A study on Slurm reuses slurm/study_array.sbatch (rank map, control-plane secret, SIGUSR1 ->
// checkpoint -> exit 3 -> requeue): `deepen study --slurm DIR` writes
//   DIR/study.list  one line per job, "CONFIG --set k=v ... --quiet" (array index = line number,
//                   counting from 0), read by study_array.sbatch
//   DIR/submit.sh   submits the jobs that have not finished: independent jobs as one array per task
//                   count, each dependent job (a matched run) as its own array element with
//                   --dependency=afterok:<job>_<index> on exactly the element it needs (or none when
//                   that run finished already). With share_teacher a job is a teacher group: one
//                   allocation of T·P + R·S tasks for its R runs (DIR/groups/), finished when all are
//   DIR/logs/       the tasks' output
struct SlurmOptions {
  std::string deepen_exe;       // absolute path of deepen on the cluster (default: this binary)
  std::string deepen_home;      // the checkout holding slurm/study_array.sbatch
  std::string workdir;          // where runs start (relative paths in configs resolve here)
  int64_t gpus_per_node = 8;
  int64_t cpus_per_task = 8;
  std::string partition;        // "" = the cluster's default
  std::string account;          // "" = none
  std::string time = "24:00:00";
};

struct SlurmScripts {
  std::string study_list;
  std::string submit_sh;
  // With share_teacher: groups/g<k>.toml under DIR for each teacher group of several runs, whose line
  // in study.list is "group <DIR>/groups/g<k>.toml --quiet" (slurm/lib.sh: deepen_run_job group ...)
  // and whose array element asks for T·P + R·S tasks.
  std::vector<std::pair<std::string, std::string>> group_files;  // (path under DIR, text)
};
// InputError when an override holds whitespace inside a quoted value (the list is split on
// whitespace); whitespace elsewhere ("curriculum.stages=[1, 2]") is removed.
SlurmScripts slurm_scripts(const StudyPlan& plan, const SlurmOptions& options, const std::string& dir);
// Writes them into `dir` (created, with logs/), submit.sh executable.
void write_slurm_study(const StudyPlan& plan, const SlurmOptions& options, const std::string& dir);

// The checkout that holds slurm/study_array.sbatch: `<exe>/../..` when the binary is in a build
// folder of the checkout, else the working directory if it holds slurm/, else "".
std::string find_deepen_home(const std::string& deepen_exe);

}  // namespace deepen
