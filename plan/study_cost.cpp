// Study cost with and without a shared teacher (see study_cost.h).
#include "plan/study_cost.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace deepen {

StudyCost study_cost(const std::vector<RunRates>& runs, const std::vector<std::vector<size_t>>& groups) {
  StudyCost c;
  for (const RunRates& r : runs) {
    if (!(r.alone_tokens_per_s > 0)) throw std::invalid_argument("study_cost: " + r.id + " has no rate");
    const double s = r.tokens / r.alone_tokens_per_s;
    c.alone_device_hours += static_cast<double>(r.teacher_devices + r.student_devices) * s / 3600.0;
    c.alone_job_hours += s / 3600.0;
  }
  for (const std::vector<size_t>& g : groups) {
    if (g.empty()) continue;
    const RunRates& first = runs.at(g.front());
    const double n = static_cast<double>(g.size());
    double rate = std::min(first.teacher_tokens_per_s, first.channel_tokens_per_s / n);
    double longest = 0;
    int64_t devices = first.teacher_devices;
    for (size_t k : g) {
      const RunRates& r = runs.at(k);
      // One run alone is exactly its own estimate (its per-stage minimum), not the coarser mean.
      rate = g.size() == 1 ? r.alone_tokens_per_s : std::min(rate, r.student_tokens_per_s);
      longest = std::max(longest, r.tokens);
      devices += r.student_devices;
    }
    const double s = longest / rate;
    c.shared_device_hours += static_cast<double>(devices) * s / 3600.0;
    c.shared_job_hours += s / 3600.0;
  }
  return c;
}

}  // namespace deepen
