// `deepen train` across ranks (mpirun, srun): each rank's role comes from the plan's rank layout.
#pragma once

#include "config/config.h"
#include "launch/job_plan.h"

namespace deepen {

// This rank's part of the job: a teacher stage loop or a student trainer. Same exit codes on every
// rank as the single-process jobs (launch/local_job.h).
int run_distributed_train_job(const Config& cfg, const JobOptions& options);

// True when this process was started by an MPI launcher with more than one rank (mpirun, srun).
bool launched_with_several_ranks();

}  // namespace deepen
