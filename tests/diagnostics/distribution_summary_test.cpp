// Distribution summary: mean, std and Pearson kurtosis against closed forms and a direct formula.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "diagnostics/distribution_summary.h"

namespace deepen {
namespace {

TEST(DistributionSummary, BernoulliQuarterHasTheHeadersNumbers) {
  const std::vector<double> v = {0, 0, 0, 1};
  const DistributionSummary s = summarize(v);
  EXPECT_EQ(s.count, 4);
  EXPECT_DOUBLE_EQ(*s.mean, 0.25);
  EXPECT_DOUBLE_EQ(*s.std, std::sqrt(0.1875));
  // Bernoulli(p): kurtosis = (1 − 6p(1−p)) / (p(1−p)) + 3.
  const double p = 0.25;
  EXPECT_DOUBLE_EQ(*s.kurtosis, (1 - 6 * p * (1 - p)) / (p * (1 - p)) + 3);
}

TEST(DistributionSummary, TwoEqualPointsHaveKurtosisOne) {
  const std::vector<double> v = {-3, 5, -3, 5};
  const DistributionSummary s = summarize(v);
  EXPECT_DOUBLE_EQ(*s.mean, 1.0);
  EXPECT_DOUBLE_EQ(*s.std, 4.0);
  EXPECT_DOUBLE_EQ(*s.kurtosis, 1.0);
}

// Independent of the two-pass code: kurtosis from the raw moments,
//   m4 = E[x⁴] − 4μE[x³] + 6μ²E[x²] − 3μ⁴,  m2 = E[x²] − μ².
// With values of O(1)..O(100) and n = 2000 the raw-moment form loses a few digits to cancellation
// (E[x⁴] ~ 1e8 against m4), so the comparison allows 1e-9 relative.
TEST(DistributionSummary, KurtosisMatchesTheRawMomentFormula) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> heavy(0.0, 1.2);  // a heavy right tail, like residual RMS
  std::vector<double> v;
  for (int i = 0; i < 2000; ++i) v.push_back(heavy(rng));
  v.push_back(150.0);  // one massive token
  double e1 = 0, e2 = 0, e3 = 0, e4 = 0;
  for (double x : v) {
    e1 += x;
    e2 += x * x;
    e3 += x * x * x;
    e4 += x * x * x * x;
  }
  const double n = static_cast<double>(v.size());
  e1 /= n, e2 /= n, e3 /= n, e4 /= n;
  const double m2 = e2 - e1 * e1;
  const double m4 = e4 - 4 * e1 * e3 + 6 * e1 * e1 * e2 - 3 * e1 * e1 * e1 * e1;
  const DistributionSummary s = summarize(v);
  EXPECT_EQ(s.count, 2001);
  EXPECT_NEAR(*s.mean, e1, 1e-12 * e1);
  EXPECT_NEAR(*s.std, std::sqrt(m2), 1e-9 * std::sqrt(m2));
  EXPECT_NEAR(*s.kurtosis, m4 / (m2 * m2), 1e-9 * m4 / (m2 * m2));
  EXPECT_GT(*s.kurtosis, 100.0);  // the massive token dominates the fourth moment
}

TEST(DistributionSummary, NormalSampleHasKurtosisNearThree) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(10.0, 2.0);
  std::vector<double> v;
  for (int i = 0; i < 200000; ++i) v.push_back(normal(rng));
  const DistributionSummary s = summarize(v);
  // The sample kurtosis of n normal draws has standard deviation sqrt(24/n) = 0.011; 5 sigma.
  EXPECT_NEAR(*s.kurtosis, 3.0, 5 * std::sqrt(24.0 / 200000));
  EXPECT_NEAR(*s.std, 2.0, 5 * 2.0 / std::sqrt(2.0 * 200000));
}

TEST(DistributionSummary, EmptyAndConstantInputsLeaveUndefinedStatisticsAbsent) {
  const DistributionSummary none = summarize({});
  EXPECT_EQ(none.count, 0);
  EXPECT_FALSE(none.mean || none.std || none.kurtosis);
  const std::vector<double> flat = {2, 2, 2};
  const DistributionSummary c = summarize(flat);
  EXPECT_EQ(*c.mean, 2.0);
  EXPECT_EQ(*c.std, 0.0);
  EXPECT_FALSE(c.kurtosis.has_value());
  EXPECT_EQ(to_json(c).dump(), R"({"count":3,"kurtosis":null,"mean":2.0,"std":0.0})");
}

}  // namespace
}  // namespace deepen
