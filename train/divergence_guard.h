// Divergence guard: whether a step's loss and gradient norm are healthy before its update is applied.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace deepen {

// What one step looked like on every student, after the students' reduction: the same numbers on
// each (the loss is a sum over students, the norm is of the mean gradient), so every student's
// guard takes the same decision at the same step without another collective.
struct StepHealth {
  int64_t step = 0;
  double loss = 0;       // the step's mean loss over every real target token of every student
  double grad_norm = 0;  // global L2 norm of the mean gradient, before clipping
  // Where a non-finite loss began: the students whose own micro-batches gave one (a NaN on one
  // student reaches every student through the sums), with their world ranks.
  std::vector<int64_t> nonfinite_students;
  std::vector<int64_t> nonfinite_world_ranks;
};

// Why the guard stopped a step. `reason` is a clause a message builds on, e.g.
//   "the loss is nan on student 1 (world rank 3)"
//   "the gradient norm is inf (the loss was finite on every student)"
//   "the loss 84.1 is over guard.spike_factor = 10 x the median 2.05 of the last 100 steps"
struct GuardTrip {
  std::string quantity;  // "loss", "gradient norm", "loss spike"
  double value = 0;
  std::string reason;
};

// The decision rule (config [guard]); the trainer acts on it. Pure: tested without a model.
// Order: a non-finite loss, then a non-finite gradient norm, then (spike_factor > 0, once the window
// holds spike_window healthy losses) a loss above spike_factor x their median. Only a healthy step's
// loss joins the window: a skipped spike does not raise the bar for the next one. The trainer
// empties the window at every phase start (a growth step's loss may legitimately jump).
// Example (spike_factor 10, spike_window 3): losses 2.0, 2.2, 2.1 -> window full, median 2.1;
// a loss of 25 trips ("loss spike"), 20 does not and joins the window (2.2, 2.1, 20 -> median 2.2).
class DivergenceGuard {
 public:
  explicit DivergenceGuard(const GuardConfig& cfg);
  std::optional<GuardTrip> check(const StepHealth& h);

  // The spike window's losses, oldest first (kept in a checkpoint's progress, so a resumed run
  // judges the next step by the same window as the uninterrupted one).
  std::vector<double> window() const { return {window_.begin(), window_.end()}; }
  void restore_window(const std::vector<double>& losses);

 private:
  GuardConfig cfg_;
  std::deque<double> window_;
};

// A number as the guard's messages write it: "nan", "inf", "-inf", or up to 6 significant digits.
std::string guard_number(double v);

}  // namespace deepen
