// Summary of a per-token quantity over tokens: count, mean, standard deviation and kurtosis.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include <nlohmann/json.hpp>

namespace deepen {

// Population moments over the n values (they describe these tokens, not a sample of a larger set):
//   mean = Σx/n   std = sqrt(m2)   kurtosis = m4 / m2²   with m_k = Σ(x − mean)^k / n
// Kurtosis is Pearson's, not excess: a normal distribution gives 3, two equal-mass points 1; the
// paper's pre-norm residual RMS (a few tokens hundreds of times the rest) gives > 2400.
// Example: {0, 0, 0, 1} -> mean 0.25, std sqrt(0.1875) = 0.4330, kurtosis 0.08203125 / 0.03515625
//   = 7/3 (a Bernoulli(p = 1/4) variable: (1 − 6p(1−p)) / (p(1−p)) + 3 = 7/3).
// Two passes in double (mean first, then central moments) so a large common offset does not
// cancel the spread. std and kurtosis are absent for n = 0; kurtosis also when every value is equal
// (0/0); mean is absent for n = 0.
struct DistributionSummary {
  int64_t count = 0;
  std::optional<double> mean, std, kurtosis;
};
DistributionSummary summarize(std::span<const double> values);

// {"count": n, "mean": .., "std": .., "kurtosis": ..}; absent statistics are null.
nlohmann::json to_json(const DistributionSummary& s);

}  // namespace deepen
