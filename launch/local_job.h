// The single-process jobs: `deepen pretrain` (CE only) and `deepen train` with the teacher in-process.
#pragma once

#include "config/config.h"
#include "launch/job_plan.h"

namespace deepen {

// Both return the process exit code: kExitOk when the curriculum finished, kExitRequeue when it
// stopped early with a checkpoint (stop_after_steps or a signal).
int run_pretrain_job(const Config& cfg, const JobOptions& options);
int run_train_job(const Config& cfg, const JobOptions& options);

}  // namespace deepen
