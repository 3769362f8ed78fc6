// Slurm environment: this task's rank, local rank and node, the job's node list, the coordinator host.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace deepen {

// What srun tells a task about itself, read from SLURM_* variables.
struct SlurmEnv {
  int rank = 0;                    // SLURM_PROCID
  int world_size = 1;              // SLURM_NTASKS (or SLURM_NPROCS)
  int local_rank = 0;              // SLURM_LOCALID: index among the tasks on this node
  int node_id = 0;                 // SLURM_NODEID: index of this node in `nodes`
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST (or SLURM_NODELIST), expanded
  std::string coordinator_host;    // nodes[0]: rank 0's node under Slurm's default block distribution
  std::string job_id;              // SLURM_JOB_ID, "" when absent
};

// Expands Slurm's compressed host list. Commas inside brackets separate ranges, outside them hosts;
// zero padding follows the lower bound; several bracket groups multiply out.
//   "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5
//   "n[8-10]"            -> n8 n9 n10
//   "r[1-2]-n[1-2]"      -> r1-n1 r1-n2 r2-n1 r2-n2
// Throws InputError naming `variable` on malformed input (unbalanced brackets, bad or reversed range).
std::vector<std::string> expand_nodelist(const std::string& list,
                                         const std::string& variable = "SLURM_JOB_NODELIST");

// Pure: the Slurm view of this task from environment variables (name -> value). nullopt when
// SLURM_PROCID is absent (not launched by srun). Throws InputError naming the variable when one is
// missing, not an integer, or inconsistent (rank >= tasks, node id outside the node list).
// Example: SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1 SLURM_NODEID=1
//          SLURM_JOB_NODELIST="gpu[01-02]" -> rank 5 of 8, local rank 1, node gpu02,
//          coordinator gpu01.
std::optional<SlurmEnv> parse_slurm_env(const std::map<std::string, std::string>& env);

// This process's SLURM_* variables, for parse_slurm_env.
std::map<std::string, std::string> slurm_environment();

}  // namespace deepen
