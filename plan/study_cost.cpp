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

CacheStudyCost cache_study_cost(const std::vector<RunRates>& runs, double cache_tokens, double cache_tokens_per_s,
                                int64_t cache_devices) {
  if (!(cache_tokens_per_s > 0)) throw std::invalid_argument("cache_study_cost: the cache job has no rate");
  CacheStudyCost c;
  const double s = cache_tokens / cache_tokens_per_s;
  c.cache_device_hours = static_cast<double>(cache_devices) * s / 3600.0;
  c.cache_job_hours = s / 3600.0;
  c.device_hours = c.cache_device_hours;
  c.job_hours = c.cache_job_hours;
  for (const RunRates& r : runs) {
    if (!(r.student_tokens_per_s > 0)) throw std::invalid_argument("cache_study_cost: " + r.id + " has no student rate");
    const double t = r.tokens / r.student_tokens_per_s;
    c.device_hours += static_cast<double>(r.student_devices) * t / 3600.0;
    c.job_hours += t / 3600.0;
  }
  return c;
}

int64_t cache_bytes_per_token_bound(int64_t samples, int64_t topk, int64_t vocab) {
  auto varint = [](int64_t v) {
    int64_t n = 1;
    for (; v >= 128; v >>= 7) ++n;
    return n;
  };
  return 4 + varint(samples) + samples * (varint(vocab - 1) + varint(samples)) + 8 * topk;
}

}  // namespace deepen
