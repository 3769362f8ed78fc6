// The divergence guard's rule: non-finite loss, non-finite gradient norm, loss spike over a running median.
#include "train/divergence_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace deepen {

std::string guard_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

namespace {

// "student 1 (world rank 3)", "students 0, 1 (world ranks 2, 3)".
std::string students_named(const StepHealth& h) {
  std::string students, ranks;
  for (size_t i = 0; i < h.nonfinite_students.size(); ++i) {
    students += (i ? ", " : "") + std::to_string(h.nonfinite_students[i]);
    if (i < h.nonfinite_world_ranks.size()) ranks += (i ? ", " : "") + std::to_string(h.nonfinite_world_ranks[i]);
  }
  const bool several = h.nonfinite_students.size() > 1;
  return (several ? "students " : "student ") + students + " (world rank" + (several ? "s " : " ") + ranks + ")";
}

double median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

}  // namespace

DivergenceGuard::DivergenceGuard(const GuardConfig& cfg) : cfg_(cfg) {}

void DivergenceGuard::restore_window(const std::vector<double>& losses) {
  window_.assign(losses.begin(), losses.end());
  while (static_cast<int64_t>(window_.size()) > cfg_.spike_window) window_.pop_front();
}

std::optional<GuardTrip> DivergenceGuard::check(const StepHealth& h) {
  if (!std::isfinite(h.loss)) {
    const std::string where = h.nonfinite_students.empty() ? " (every student's own loss was finite: their sum overflowed)"
                                                           : " on " + students_named(h);
    return GuardTrip{"loss", h.loss, "the loss is " + guard_number(h.loss) + where};
  }
  if (!std::isfinite(h.grad_norm))
    return GuardTrip{"gradient norm", h.grad_norm,
                     "the gradient norm is " + guard_number(h.grad_norm) + " (the loss " + guard_number(h.loss) +
                         " was finite on every student)"};
  if (cfg_.spike_factor > 0 && static_cast<int64_t>(window_.size()) >= cfg_.spike_window) {
    const double m = median({window_.begin(), window_.end()});
    if (h.loss > cfg_.spike_factor * m)
      return GuardTrip{"loss spike", h.loss,
                       "the loss " + guard_number(h.loss) + " is over guard.spike_factor = " +
                           guard_number(cfg_.spike_factor) + " x the median " + guard_number(m) + " of the last " +
                           std::to_string(window_.size()) + " steps"};
  }
  window_.push_back(h.loss);
  while (static_cast<int64_t>(window_.size()) > cfg_.spike_window) window_.pop_front();
  return std::nullopt;
}

}  // namespace deepen
