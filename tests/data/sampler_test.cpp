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

// Documents of steps [first, last] in sample order.
std::vector<int64_t> steps(const Sampler& s, int64_t first, int64_t last) {
  std::vector<int64_t> out;
  for (int64_t k = first; k <= last; ++k) {
    const auto st = s.step(k);
    out.insert(out.end(), st.begin(), st.end());
  }
  return out;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Sampler, ReplayShardGivesEveryPhaseTheSameDocumentsInANewOrder) {
  // 100 documents, a shard of the first 24, 6 samples per step: a phase of 4 steps is the shard.
  const Sampler grow(42, 100, {2, 1, 3}, {24, true});
  std::vector<int64_t> shard(24);
  for (int64_t i = 0; i < 24; ++i) shard[size_t(i)] = i;
  const std::vector<int64_t> p0 = steps(grow, 0, 3), p1 = steps(grow, 4, 7), p2 = steps(grow, 8, 11);
  EXPECT_EQ(sorted(p0), shard);
  EXPECT_EQ(sorted(p1), shard);
  EXPECT_EQ(sorted(p2), shard);
  EXPECT_NE(p0, p1);
  // (The iterator is never reset: a sample is a function of the global step alone, so nothing
  // about a phase change can reach it.)
}

TEST(Sampler, FreshRunReadsTheShardOnceThenContinuesOntoDocumentsAfterIt) {
  const Sampler grow(42, 100, {2, 1, 3}, {24, true}), fresh(42, 100, {2, 1, 3}, {24, false});
  EXPECT_EQ(steps(fresh, 0, 3), steps(grow, 0, 3));
  // Samples 24 .. 99: every document after the shard exactly once, then again in a new order.
  std::vector<int64_t> rest;
  for (int64_t g = 24; g < 100; ++g) rest.push_back(fresh.at(g));
  std::vector<int64_t> want(76);
  for (int64_t i = 0; i < 76; ++i) want[size_t(i)] = 24 + i;
  EXPECT_EQ(sorted(rest), want);
  std::vector<int64_t> again;
  for (int64_t g = 100; g < 176; ++g) again.push_back(fresh.at(g));
  EXPECT_EQ(sorted(again), want);
  EXPECT_NE(again, rest);
  // A shard of every document leaves nothing to continue onto.
  const Sampler all(1, 10, {1, 1, 1}, {10, false});
  EXPECT_NO_THROW(all.at(9));
  EXPECT_THROW(all.at(10), std::out_of_range);
  EXPECT_THROW(Sampler(1, 10, {1, 1, 1}, {11, true}), std::invalid_argument);
}

TEST(Sampler, ValidationAndDiagnosticBatchesAreFixed) {
  EXPECT_EQ(validation_sequences(10, 4, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(validation_sequences(10, 4, 2), (std::vector<int64_t>{8, 9, 0, 1}));  // wraps
  EXPECT_EQ(diagnostic_sequences(10, 4), (std::vector<int64_t>{0, 2, 5, 7}));
  EXPECT_EQ(diagnostic_sequences(3, 5), (std::vector<int64_t>{0, 0, 1, 1, 2}));
}

}  // namespace
}  // namespace deepen
