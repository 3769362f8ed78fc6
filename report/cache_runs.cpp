// Report notes for runs that trained from a teacher cache (see cache_runs.h).
#include "report/cache_runs.h"

#include <map>
#include <sstream>

namespace deepen {

std::vector<std::string> cache_run_notes(const std::vector<RunData>& runs) {
  std::map<std::string, std::string> by_setting;  // setting -> the runs, in the runs' order
  for (const RunData& r : runs) {
    const Config& c = r.config;
    if (c.distill.source != DistillSource::kCache) continue;
    std::ostringstream setting;
    setting << "trained from the teacher cache " << c.cache.dir << " (cache.dir): ";
    if (c.cache.targets == CacheTargets::kTopk)
      setting << "its top-" << c.cache.topk << " log-probabilities at τ = " << c.distill.temperature << " (distill.tail = \""
              << option_name(c.distill.tail) << "\"; biased, for comparison)";
    else
      setting << "sampled targets, K = " << c.cache.samples << " draws per token at τ = " << c.distill.temperature
              << " (RS-KD, unbiased)";
    setting << "; val_kl is an estimate from K draws per validation token, val_ce is exact";
    std::string& list = by_setting[setting.str()];
    list += (list.empty() ? "" : ", ") + c.run.name + " seed " + std::to_string(c.run.seed);
  }
  std::vector<std::string> notes;
  for (const auto& [setting, list] : by_setting) notes.push_back(setting + ": " + list);
  return notes;
}

}  // namespace deepen
