// Learning-rate schedule (see lr_schedule.h for the formulas and worked examples).
#include "curriculum/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace deepen {

namespace {

// Warmup then cosine (or constant) over `total` steps, at step s in [0, total).
double warmup_cosine(const LrSchedule& c, int64_t s, int64_t total) {
  const double lr = c.lr;
  const int64_t warmup_steps = c.warmup_steps;
  if (s < warmup_steps) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup_steps);
  if (!c.cosine) return lr;
  const int64_t span = total - 1 - warmup_steps;
  if (span <= 0) return lr;
  const double progress = static_cast<double>(s - warmup_steps) / static_cast<double>(span);
  const double floor = lr * c.min_lr_ratio;
  return floor + (lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace

double LrSchedule::base_at(int64_t step) const {
  const int64_t s = std::clamp<int64_t>(step, 0, std::max<int64_t>(total_steps - 1, 0));
  if (restart_each_phase && !phase_begin.empty()) {
    // The phase holding s: the last whose first step is <= s.
    const auto it = std::upper_bound(phase_begin.begin(), phase_begin.end(), s) - 1;
    const int64_t end = it + 1 == phase_begin.end() ? total_steps : *(it + 1);
    return warmup_cosine(*this, s - *it, end - *it);
  }
  return warmup_cosine(*this, s, total_steps);
}

double LrSchedule::at(int64_t step) const {
  const double base = base_at(step);
  if (rewarmup_steps <= 0) return base;
  // The most recent growth step at or before `step`.
  auto it = std::upper_bound(growth_steps.begin(), growth_steps.end(), step);
  if (it == growth_steps.begin()) return base;
  const int64_t since = step - *(it - 1);
  if (since >= rewarmup_steps) return base;
  return base * static_cast<double>(since + 1) / static_cast<double>(rewarmup_steps);
}

LrSchedule make_lr_schedule(const OptimConfig& optim, const GrowthSchedule& growth, int64_t rewarmup_steps,
                            bool restart_each_phase) {
  LrSchedule s;
  s.lr = optim.lr;
  s.min_lr_ratio = optim.min_lr_ratio;
  s.warmup_steps = optim.warmup_steps;
  s.cosine = optim.schedule == LrShape::kCosine;
  s.total_steps = growth.total_steps();
  for (int k = 1; k < growth.num_stages(); ++k) s.growth_steps.push_back(growth.first_step(k));
  s.rewarmup_steps = rewarmup_steps;
  s.restart_each_phase = restart_each_phase;
  s.phase_begin = growth.stage_begin;
  return s;
}

}  // namespace deepen
