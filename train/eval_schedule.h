// When evals run: one rule shared by the trainer and the teacher ranks that feed its eval batches.
#pragma once

#include <cstdint>

#include "curriculum/growth_schedule.h"
#include "launch/config.h"

namespace deepen {

// After step `step` (0-based): every eval.every steps and at the end of every stage.
// Example: eval.every = 4, stages of 3 steps: evals after steps 2, 3, 5, 7, 8.
inline bool is_eval_step(const Config& cfg, const GrowthSchedule& schedule, int64_t step) {
  return (step + 1) % cfg.eval.every == 0 || schedule.is_stage_end(step);
}

// Eval batch i is evaluated by student i mod S (S = parallel.students), so S students split an
// eval without overlap and the sum over students equals the single-process eval.
inline int64_t eval_batch_owner(int64_t batch, int64_t students) { return batch % students; }

}  // namespace deepen
