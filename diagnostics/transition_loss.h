// Transition-aligned training loss: the jump, AUC and recovery of the loss at every block append.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deepen {

// Window lengths, in optimizer steps, of the transition metrics for a phase of `phase_steps`
// steps. The paper measures over 1,000 and 5,000 steps with a 200-step smoothing in 50,000-step
// phases; a shorter run keeps the same fractions of its phase (2 %, 10 %, 0.4 %), rounded to the
// nearest step and at least 1, so a reduced run measures the same part of its curriculum.
// Examples: 50000 -> {1000, 5000, 200}   100 -> {2, 10, 1}   600 -> {12, 60, 2}
struct TransitionWindows {
  int64_t short_steps = 0;   // the paper's 1k AUC window
  int64_t long_steps = 0;    // the paper's 5k AUC window
  int64_t smooth_steps = 0;  // the paper's 200-step smoothing (baseline and recovery)
};
TransitionWindows transition_windows(int64_t phase_steps);  // std::invalid_argument if < 1

// The loss around one block append at step t (the first step trained at the new depth), with
// w = windows.smooth_steps:
//   baseline        mean loss over the w steps before t (fewer if the previous phase is shorter)
//   jump            loss[t] − baseline
//   auc_short/long  Σ_{k=0}^{n−1} (loss[t+k] − baseline), n = the window, cut at the phase's end
//                   (the next append or the end of the curve); positive = above the baseline.
//                   Units: loss × steps. auc_*_steps says how many steps were summed.
//   recovery_steps  k+1 for the first k >= w−1 with mean(loss[t+k−w+1 .. t+k]) <= baseline: steps
//                   trained at the new depth until a w-step smoothed loss is back at the baseline.
//                   The window lies wholly after t, so recovery is never under w steps; absent if
//                   the smoothed loss never returns within the phase.
// Example: loss = [4, 3, 2, 2 | 5, 3, 1.5, 1] (append at t = 4), phase 4 steps -> w = 1:
//   baseline 2, jump 3, recovery_steps 3 (loss[6] = 1.5 <= 2), with a 2-step window
//   auc = (5−2) + (3−2) = 4.
struct TransitionLoss {
  int64_t step = 0;  // t
  TransitionWindows windows;
  double baseline = 0;
  double jump = 0;
  double auc_short = 0, auc_long = 0;
  int64_t auc_short_steps = 0, auc_long_steps = 0;
  std::optional<int64_t> recovery_steps;
};

// loss[s] = training loss of step s (s = 0 .. n−1, a metrics.jsonl curve without gaps);
// stage_begin = first step of every stage (stage_begin[0] = 0), stage_depth = its active depth.
// An append is a stage whose depth exceeds the previous one's (a joint run's LR-restart phases at
// one depth are not). Windows follow the length of the phase that starts at each append; the
// baseline looks back no further than the previous stage's start. Appends at or beyond the curve's
// end (a run still in progress) are left out. Throws std::invalid_argument when stage_begin does
// not start at 0 or does not increase, or the two lists differ in length.
// Example: stage_begin [0, 100, 200], stage_depth [3, 6, 9], total 300 -> appends at 100 and 200,
//   each with transition_windows(100).
std::vector<TransitionLoss> transition_losses(const std::vector<double>& loss, const std::vector<int64_t>& stage_begin,
                                              const std::vector<int64_t>& stage_depth, int64_t total_steps);

// The same with explicit windows for the append at t, whose phase ends before step `end`
// (t < end <= loss.size()) and whose previous phase starts at `prev_begin` (< t).
TransitionLoss transition_loss(const std::vector<double>& loss, int64_t prev_begin, int64_t t, int64_t end,
                               const TransitionWindows& windows);

}  // namespace deepen
