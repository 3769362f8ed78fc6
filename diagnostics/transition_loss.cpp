// Transition-aligned training loss (see transition_loss.h): plain sums over a loss curve.
#include "diagnostics/transition_loss.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace deepen {
namespace {

int64_t fraction_of(int64_t phase_steps, double fraction) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(phase_steps) * fraction));
}

}  // namespace

TransitionWindows transition_windows(int64_t phase_steps) {
  if (phase_steps < 1) throw std::invalid_argument("transition windows: a phase has at least one step, got " +
                                                   std::to_string(phase_steps));
  // The paper's windows over its 50,000-step phases: 1000 / 50000, 5000 / 50000, 200 / 50000.
  return {fraction_of(phase_steps, 0.02), fraction_of(phase_steps, 0.1), fraction_of(phase_steps, 0.004)};
}

TransitionLoss transition_loss(const std::vector<double>& loss, int64_t prev_begin, int64_t t, int64_t end,
                               const TransitionWindows& windows) {
  const int64_t n = static_cast<int64_t>(loss.size());
  if (!(0 <= prev_begin && prev_begin < t && t < end && end <= n))
    throw std::invalid_argument("transition loss: need 0 <= previous phase start < append < phase end <= " +
                                std::to_string(n) + " steps, got " + std::to_string(prev_begin) + ", " +
                                std::to_string(t) + ", " + std::to_string(end));
  if (windows.short_steps < 1 || windows.long_steps < 1 || windows.smooth_steps < 1)
    throw std::invalid_argument("transition loss: every window needs at least one step");
  const auto at = [&](int64_t s) { return loss[static_cast<size_t>(s)]; };
  TransitionLoss r;
  r.step = t;
  r.windows = windows;
  const int64_t w = windows.smooth_steps;
  const int64_t from = std::max(prev_begin, t - w);
  double sum = 0;
  for (int64_t s = from; s < t; ++s) sum += at(s);
  r.baseline = sum / static_cast<double>(t - from);
  r.jump = at(t) - r.baseline;

  const auto auc = [&](int64_t window, double& value, int64_t& steps) {
    steps = std::min(window, end - t);
    value = 0;
    for (int64_t k = 0; k < steps; ++k) value += at(t + k) - r.baseline;
  };
  auc(windows.short_steps, r.auc_short, r.auc_short_steps);
  auc(windows.long_steps, r.auc_long, r.auc_long_steps);

  // Running w-step sum of the window ending at t+k, for k >= w−1 (the window starts at t).
  double window_sum = 0;
  for (int64_t k = 0; t + k < end; ++k) {
    window_sum += at(t + k);
    if (k >= w) window_sum -= at(t + k - w);
    if (k >= w - 1 && window_sum / static_cast<double>(w) <= r.baseline) {
      r.recovery_steps = k + 1;
      break;
    }
  }
  return r;
}

std::vector<TransitionLoss> transition_losses(const std::vector<double>& loss, const std::vector<int64_t>& stage_begin,
                                              const std::vector<int64_t>& stage_depth, int64_t total_steps) {
  if (stage_depth.size() != stage_begin.size())
    throw std::invalid_argument("transition loss: " + std::to_string(stage_begin.size()) + " stage starts but " +
                                std::to_string(stage_depth.size()) + " stage depths");
  if (stage_begin.empty() || stage_begin[0] != 0)
    throw std::invalid_argument("transition loss: the first stage must begin at step 0");
  for (size_t i = 1; i < stage_begin.size(); ++i)
    if (stage_begin[i] <= stage_begin[i - 1])
      throw std::invalid_argument("transition loss: stage beginnings must increase (stage " + std::to_string(i) +
                                  " begins at " + std::to_string(stage_begin[i]) + ")");
  const int64_t n = static_cast<int64_t>(loss.size());
  std::vector<TransitionLoss> out;
  for (size_t i = 1; i < stage_begin.size(); ++i) {
    const int64_t t = stage_begin[i];
    if (t >= n) break;
    if (stage_depth[i] <= stage_depth[i - 1]) continue;  // a new phase at the same depth: no append
    const int64_t phase_end = i + 1 < stage_begin.size() ? stage_begin[i + 1] : total_steps;
    out.push_back(transition_loss(loss, stage_begin[i - 1], t, std::min(phase_end, n),
                                  transition_windows(phase_end - t)));
  }
  return out;
}

}  // namespace deepen
