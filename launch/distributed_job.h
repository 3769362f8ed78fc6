// `deepen train` across ranks (mpirun, srun): each rank's role comes from the plan's rank layout.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "launch/job_plan.h"

namespace deepen {

// This rank's part of the job: a teacher stage loop or a student trainer. Same exit codes on every
// rank as the single-process jobs (launch/local_job.h).
int run_distributed_train_job(const Config& cfg, const JobOptions& options);

// `deepen group`: runs that share one teacher pass (study/teacher_groups.h), each with its own
// students, folder and records, in one job of T·P + R·S ranks; `job_dir` holds the teacher's records
// and the control secret. Every run resumes from its own newest checkpoint. Exit codes as above: 0
// when every run finished, 3 when the job stopped with every run checkpointed.
int run_shared_teacher_job(const std::vector<Config>& runs, const std::string& job_dir, const JobOptions& options);

// True when this process was started by an MPI launcher with more than one rank (mpirun, srun).
bool launched_with_several_ranks();

}  // namespace deepen
