// The single-process jobs: `deepen pretrain` (CE only) and `deepen train` (teacher in-process).
#pragma once

#include <cstdint>
#include <optional>

#include "launch/config.h"

namespace deepen {

struct JobOptions {
  bool resume = true;                       // continue from the newest valid checkpoint if any
  std::optional<int64_t> stop_after_steps;  // stop with a checkpoint after this many steps
  bool print_progress = true;
};

// Both return the process exit code: kExitOk when the curriculum finished, kExitRequeue when it
// stopped early with a checkpoint (stop_after_steps or a signal).
int run_pretrain_job(const Config& cfg, const JobOptions& options);
int run_train_job(const Config& cfg, const JobOptions& options);

}  // namespace deepen
