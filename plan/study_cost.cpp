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
  g.bound = g.tokens_per_s == teacher ? "teacher" : g.tokens_per_s == channel ? "channel" : "students";
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

}  // namespace deepen
