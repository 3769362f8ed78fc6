// Sampler: a permutation per epoch, and the same global batch however students split it.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/sampler.h"

namespace deepen {
namespace {

TEST(Sampler, PermuteIndexIsABijectionForAwkwardSizes) {
  for (int64_t n : {1, 2, 3, 7, 10, 64, 1000, 4097}) {
    std::set<int64_t> seen;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = permute_index(i, n, 42);
      ASSERT_GE(j, 0);
      ASSERT_LT(j, n);
      seen.insert(j);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "n=" << n;
  }
}

TEST(Sampler, EveryEpochVisitsEachSequenceOnceInANewOrder) {
  Sampler s(7, 50, {1, 1, 5});
  std::vector<int64_t> e0, e1;
  for (int64_t p = 0; p < 50; ++p) e0.push_back(s.at(p));
  for (int64_t p = 50; p < 100; ++p) e1.push_back(s.at(p));
  EXPECT_NE(e0, e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  for (int64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(e0[static_cast<size_t>(i)], i);
    EXPECT_EQ(e1[static_cast<size_t>(i)], i);
  }
}

TEST(Sampler, TwoStudentsSeeTheSameGlobalBatchAsOneProcessWithMoreAccumulation) {
  Sampler two(3, 1000, {2, 2, 4});   // 2 students × 2 micro-batches × 4 sequences
  Sampler one(3, 1000, {1, 4, 4});   // 1 process × 4 micro-batches × 4 sequences
  for (int64_t step : {0, 1, 17, 300}) {
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t m = 0; m < 2; ++m) {
        EXPECT_EQ(two.micro_batch(step, r, m), one.micro_batch(step, 0, r * 2 + m)) << step << " " << r << " " << m;
      }
    }
  }
}

TEST(Sampler, SeedChangesTheOrder) {
  EXPECT_NE(Sampler(1, 1000, {1, 1, 8}).micro_batch(0, 0, 0), Sampler(2, 1000, {1, 1, 8}).micro_batch(0, 0, 0));
}

}  // namespace
}  // namespace deepen
