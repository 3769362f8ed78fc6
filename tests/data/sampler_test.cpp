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


TEST(Sampler, WorkedExampleLayoutsCoverTheSameStep) {
  // G = 8, b = 2: R=2,A=2 / R=1,A=4 / R=4,A=1 give the same micro-batches; b = 8 the same set.
  const Sampler r2a2(5, 777, {2, 2, 2}), r1a4(5, 777, {1, 4, 2}), r4a1(5, 777, {4, 1, 2}), b8(5, 777, {1, 1, 8});
  for (int64_t step : {0, 3, 97, 1000}) {  // 97 * 8 > 777: later epochs too
    std::vector<int64_t> a, b, c;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t m = 0; m < 2; ++m) {
        const auto mb = r2a2.micro_batch(step, r, m);
        a.insert(a.end(), mb.begin(), mb.end());
      }
    for (int64_t m = 0; m < 4; ++m) {
      const auto mb = r1a4.micro_batch(step, 0, m);
      b.insert(b.end(), mb.begin(), mb.end());
    }
    for (int64_t r = 0; r < 4; ++r) {
      const auto mb = r4a1.micro_batch(step, r, 0);
      c.insert(c.end(), mb.begin(), mb.end());
    }
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
    EXPECT_EQ(a, b8.micro_batch(step, 0, 0));
    EXPECT_EQ(a, r2a2.step(step));
  }
}

TEST(Sampler, IsAPureFunctionOfItsArguments) {
  const Sampler s(9, 12345, {2, 3, 4});
  const Sampler again(9, 12345, {2, 3, 4});
  EXPECT_EQ(s.micro_batch(41, 1, 2), again.micro_batch(41, 1, 2));
  EXPECT_EQ(s.at(123456), again.at(123456));
  EXPECT_THROW(s.micro_batch(0, 2, 0), std::invalid_argument);
  EXPECT_THROW(s.micro_batch(0, 0, 3), std::invalid_argument);
  EXPECT_THROW(Sampler(1, 0, {1, 1, 1}), std::invalid_argument);
}

TEST(Sampler, ValidationAndDiagnosticBatchesAreFixed) {
  EXPECT_EQ(validation_sequences(10, 4, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(validation_sequences(10, 4, 2), (std::vector<int64_t>{8, 9, 0, 1}));  // wraps
  EXPECT_EQ(diagnostic_sequences(10, 4), (std::vector<int64_t>{0, 2, 5, 7}));
  EXPECT_EQ(diagnostic_sequences(3, 5), (std::vector<int64_t>{0, 0, 1, 1, 2}));
}

}  // namespace
}  // namespace deepen
