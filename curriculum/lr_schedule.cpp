// Learning-rate schedule (see lr_schedule.h for the formulas and worked examples).
#include "curriculum/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace deepen {

double LrSchedule::base_at(int64_t step) const {
  const int64_t s = std::clamp<int64_t>(step, 0, std::max<int64_t>(total_steps - 1, 0));
  if (s < warmup_steps) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup_steps);
  if (!cosine) return lr;
  const int64_t span = total_steps - 1 - warmup_steps;
  if (span <= 0) return lr;
  const double progress = static_cast<double>(s - warmup_steps) / static_cast<double>(span);
  const double floor = lr * min_lr_ratio;
  return floor + (lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
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

LrSchedule make_lr_schedule(const OptimConfig& optim, const GrowthSchedule& growth, int64_t rewarmup_steps) {
  LrSchedule s;
  s.lr = optim.lr;
  s.min_lr_ratio = optim.min_lr_ratio;
  s.warmup_steps = optim.warmup_steps;
  s.cosine = optim.schedule == "cosine";
  s.total_steps = growth.total_steps();
  for (int k = 1; k < growth.num_stages(); ++k) s.growth_steps.push_back(growth.first_step(k));
  s.rewarmup_steps = rewarmup_steps;
  return s;
}

}  // namespace deepen
