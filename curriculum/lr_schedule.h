// Learning-rate schedule: warmup then cosine (or constant), with optional re-warmup after growth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "curriculum/growth_schedule.h"

namespace deepen {

// lr(step) for steps 0 .. total_steps-1, a pure function so a resumed run needs no scheduler state
// beyond the step.
//
// Base schedule (W = warmup_steps, T = total_steps, m = lr · min_lr_ratio):
//   warmup   s < W:  lr · (s + 1) / W                  (step 0 already trains; step W-1 reaches lr)
//   cosine   s >= W: m + (lr − m) · ½ (1 + cos(π · (s − W) / (T − 1 − W)))
//            so step W runs at lr and the last step T-1 at exactly m (if T − 1 − W <= 0: lr)
//   constant s >= W: lr
// Worked example: lr = 1, min_lr_ratio = 0.1, W = 2, T = 6, cosine
//   step:  0    1    2    3      4      5
//   lr:    0.5  1.0  1.0  0.775  0.325  0.1
//
// Re-warmup (R = rewarmup_steps > 0): after each growth step g (the first step of a stage > 0), the
// base value is scaled by (s − g + 1) / R for g <= s < g + R: a linear ramp from 0 (the value one
// step before g on that line) back to the base schedule, which it meets at s = g + R − 1. New
// blocks start with fresh optimizer state, and a full-size first update would hit them hardest. A
// growth inside another's ramp restarts the ramp.
// Worked example: the one above, growth at step 3, R = 2
//   step:  0    1    2    3               4      5
//   lr:    0.5  1.0  1.0  0.775·½=0.3875  0.325  0.1
//
// Restart per phase (curriculum.phase_policy = "reset", the paper): every phase (stage) is a
// schedule of its own, the base formula above with s counted from the phase's first step and T
// its length: a full warmup, then cosine down to exactly m at the phase's last step.
// Worked example: lr = 1, min_lr_ratio = 0.1, W = 1, phases of 4 steps at 0 and 4, cosine
//   step:  0    1    2     3    | 4    5    6     7
//   lr:    1.0  1.0  0.55  0.1  | 1.0  1.0  0.55  0.1
// and with W = 2:  0.5 1.0 1.0 0.1 | 0.5 1.0 1.0 0.1
struct LrSchedule {
  double lr = 3e-4;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  bool cosine = true;                // false: constant after warmup
  int64_t total_steps = 1;
  std::vector<int64_t> growth_steps; // ascending; each restarts the re-warmup ramp
  int64_t rewarmup_steps = 0;        // 0 = no re-warmup
  bool restart_each_phase = false;   // phase_policy = "reset": phase_begin cut the run into schedules
  std::vector<int64_t> phase_begin;  // first step of every phase (stage), ascending, [0] = 0

  // The learning rate at `step` (0 <= step; steps past the end keep the last value).
  double at(int64_t step) const;
  // The base schedule alone, without re-warmup.
  double base_at(int64_t step) const;
};

// From optim.* and curriculum.rewarmup_steps, over the growth schedule's steps and phase starts;
// restart_each_phase for curriculum.phase_policy = "reset".
LrSchedule make_lr_schedule(const OptimConfig& optim, const GrowthSchedule& growth, int64_t rewarmup_steps,
                            bool restart_each_phase = false);

}  // namespace deepen
