// Distribution summary (see distribution_summary.h): two-pass population moments in double.
#include "diagnostics/distribution_summary.h"

#include <cmath>

namespace deepen {

DistributionSummary summarize(std::span<const double> values) {
  DistributionSummary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  const double n = static_cast<double>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  const double mean = sum / n;
  double m2 = 0, m4 = 0;
  for (double v : values) {
    const double d2 = (v - mean) * (v - mean);
    m2 += d2;
    m4 += d2 * d2;
  }
  m2 /= n;
  m4 /= n;
  s.mean = mean;
  s.std = std::sqrt(m2);
  if (m2 > 0) s.kurtosis = m4 / (m2 * m2);
  return s;
}

nlohmann::json to_json(const DistributionSummary& s) {
  const auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"count", s.count}, {"mean", opt(s.mean)}, {"std", opt(s.std)}, {"kurtosis", opt(s.kurtosis)}};
}

}  // namespace deepen
