// Study cost with and without a shared teacher (see study_cost.h).
#include "plan/study_cost.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace deepen {

GroupPrice price_group(const std::vector<RunRates>& runs, const std::vector<size_t>& members, int64_t pipelines) {
  if (members.empty()) throw std::invalid_argument("price_group: a group without runs");
  const RunRates& first = runs.at(members.front());
  const int64_t T0 = std::max<int64_t>(1, first.teacher_pipelines);
  const double scale = static_cast<double>(pipelines) / static_cast<double>(T0);
  GroupPrice g;
  g.pipelines = pipelines;
  g.devices = first.teacher_devices / T0 * pipelines;
  const double n = static_cast<double>(members.size());
  const double teacher = first.teacher_tokens_per_s * scale, channel = first.channel_tokens_per_s * scale / n;
  double students = INFINITY, longest = 0;
  for (size_t k : members) {
    const RunRates& r = runs.at(k);
    students = std::min(students, r.student_tokens_per_s);
    longest = std::max(longest, r.tokens);
    g.devices += r.student_devices;
  }
  g.tokens_per_s = std::min({teacher, channel, students});
  g.bound = g.tokens_per_s == students ? "students" : g.tokens_per_s == channel ? "channel" : "teacher";
  // One run alone on its own layout is exactly its own estimate (its per-stage minimum), not the
  // coarser curriculum mean of the three.
  if (members.size() == 1 && pipelines == T0) g.tokens_per_s = first.alone_tokens_per_s;
  if (!(g.tokens_per_s > 0)) throw std::invalid_argument("price_group: " + first.id + " has no rate");
  g.hours = longest / g.tokens_per_s / 3600.0;
  g.device_hours = static_cast<double>(g.devices) * g.hours;
  return g;
}

int64_t cheapest_pipelines(const std::vector<RunRates>& runs, const std::vector<size_t>& members) {
  const int64_t S = runs.at(members.front()).student_devices;
  int64_t best = std::max<int64_t>(1, runs.at(members.front()).teacher_pipelines);
  double best_hours = price_group(runs, members, best).device_hours;
  for (int64_t T = 1; T <= S; ++T) {
    if (S % T != 0) continue;
    const double h = price_group(runs, members, T).device_hours;
    if (h < best_hours * (1 - 1e-12)) best = T, best_hours = h;
  }
  return best;
}

std::vector<std::vector<size_t>> cheapest_groups(const std::vector<RunRates>& runs,
                                                 const std::vector<std::vector<size_t>>& classes, size_t max_runs) {
  std::vector<std::vector<size_t>> out;
  for (std::vector<size_t> c : classes) {
    std::stable_sort(c.begin(), c.end(), [&](size_t a, size_t b) { return runs.at(a).tokens > runs.at(b).tokens; });
    const size_t n = c.size();
    // best[i]: the fewest device-hours for the first i runs; cut[i]: where their last group starts.
    std::vector<double> best(n + 1, INFINITY);
    std::vector<size_t> cut(n + 1, 0);
    best[0] = 0;
    for (size_t i = 1; i <= n; ++i)
      for (size_t j = i; j-- > 0;) {
        if (max_runs > 0 && i - j > max_runs) break;
        const std::vector<size_t> group(c.begin() + static_cast<std::ptrdiff_t>(j), c.begin() + static_cast<std::ptrdiff_t>(i));
        const bool fits = std::all_of(group.begin(), group.end(), [&](size_t k) {
          const int64_t most = runs.at(k).max_shared_runs;
          return most <= 0 || static_cast<int64_t>(group.size()) <= most;
        });
        if (!fits && group.size() > 1) break;  // larger groups fit no better
        const double h = best[j] + price_group(runs, group, cheapest_pipelines(runs, group)).device_hours;
        if (h < best[i]) best[i] = h, cut[i] = j;
      }
    std::vector<std::vector<size_t>> groups;
    for (size_t i = n; i > 0; i = cut[i]) {
      std::vector<size_t> group(c.begin() + static_cast<std::ptrdiff_t>(cut[i]), c.begin() + static_cast<std::ptrdiff_t>(i));
      std::sort(group.begin(), group.end());  // the study's order inside a group
      groups.push_back(std::move(group));
    }
    std::reverse(groups.begin(), groups.end());
    for (auto& g : groups) out.push_back(std::move(g));
  }
  return out;
}

StudyCost study_cost(const std::vector<RunRates>& runs, const std::vector<std::vector<size_t>>& groups,
                     const std::vector<int64_t>& pipelines) {
  StudyCost c;
  for (const RunRates& r : runs) {
    if (!(r.alone_tokens_per_s > 0)) throw std::invalid_argument("study_cost: " + r.id + " has no rate");
    const double s = r.tokens / r.alone_tokens_per_s;
    c.alone_device_hours += static_cast<double>(r.teacher_devices + r.student_devices) * s / 3600.0;
    c.alone_job_hours += s / 3600.0;
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::vector<size_t>& g = groups[i];
    if (g.empty()) continue;
    const int64_t T = i < pipelines.size() && pipelines[i] > 0 ? pipelines[i]
                                                                : std::max<int64_t>(1, runs.at(g.front()).teacher_pipelines);
    const GroupPrice p = price_group(runs, g, T);
    c.shared_device_hours += p.device_hours;
    c.shared_job_hours += p.hours;
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
