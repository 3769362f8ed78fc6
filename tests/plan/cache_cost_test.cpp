// The study's cost with a teacher cache (plan/study_cost.h's worked example) and the cache's bytes per token.
#include <gtest/gtest.h>

#include "plan/study_cost.h"

namespace deepen {
namespace {

TEST(CacheCost, TheWorkedExample) {
  // study_cost's two runs: T·P = 8, S = 8, 1e9 tokens each; students 2e5 tokens/s.
  std::vector<RunRates> runs(2);
  for (RunRates& r : runs) r = {"r", 8, 8, 1e9, 1e5, 1e6, 2e5, 1e5};
  const CacheStudyCost c = cache_study_cost(runs, 1e9, 1e5, 8);
  EXPECT_NEAR(c.cache_device_hours, 22.22, 0.01);
  EXPECT_NEAR(c.device_hours, 44.44, 0.01);
  EXPECT_NEAR(c.job_hours, 5.56, 0.01);
  EXPECT_NEAR(study_cost(runs, {{0}, {1}}).alone_device_hours, 88.89, 0.01);
}

TEST(CacheCost, BytesPerTokenBound) {
  EXPECT_EQ(cache_bytes_per_token_bound(64, 0, 151936), 261);
  EXPECT_EQ(cache_bytes_per_token_bound(8, 0, 151936), 37);
  EXPECT_EQ(cache_bytes_per_token_bound(64, 64, 151936), 261 + 512);
  EXPECT_EQ(cache_bytes_per_token_bound(200, 0, 100), 4 + 2 + 200 * (1 + 2));  // ids < 128, counts up to 200
}

}  // namespace
}  // namespace deepen
