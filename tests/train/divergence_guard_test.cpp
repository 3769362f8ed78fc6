// DivergenceGuard: the rule that stops a step before its update (non-finite loss or norm, spikes).
#include <gtest/gtest.h>

#include <limits>

#include "config/config.h"
#include "train/divergence_guard.h"

namespace deepen {
namespace {

StepHealth step(int64_t s, double loss, double norm = 1.0) {
  StepHealth h;
  h.step = s;
  h.loss = loss;
  h.grad_norm = norm;
  return h;
}

TEST(DivergenceGuard, ANanLossTripsNamingTheStudentWhereItBegan) {
  DivergenceGuard guard(GuardConfig{});
  StepHealth h = step(5, std::numeric_limits<double>::quiet_NaN());
  h.nonfinite_students = {1};
  h.nonfinite_world_ranks = {3};
  const auto trip = guard.check(h);
  ASSERT_TRUE(trip);
  EXPECT_EQ(trip->quantity, "loss");
  EXPECT_EQ(trip->reason, "the loss is nan on student 1 (world rank 3)");
}

TEST(DivergenceGuard, AnInfiniteGradientNormWithAFiniteLossTrips) {
  DivergenceGuard guard(GuardConfig{});
  const auto trip = guard.check(step(2, 2.5, std::numeric_limits<double>::infinity()));
  ASSERT_TRUE(trip);
  EXPECT_EQ(trip->quantity, "gradient norm");
  EXPECT_NE(trip->reason.find("the gradient norm is inf"), std::string::npos) << trip->reason;
}

TEST(DivergenceGuard, FiniteStepsPassAndTheSpikeTestIsOffByDefault) {
  DivergenceGuard guard(GuardConfig{});
  for (int64_t s = 0; s < 200; ++s) EXPECT_FALSE(guard.check(step(s, 2.0)));
  EXPECT_FALSE(guard.check(step(200, 2.0e6)));  // a huge but finite loss: spike_factor = 0 is off
}

// The worked example of divergence_guard.h: spike_factor 10, spike_window 3.
TEST(DivergenceGuard, ASpikePastTheFactorTimesTheMedianTripsOnlyOnceTheWindowIsFull) {
  GuardConfig cfg;
  cfg.spike_factor = 10;
  cfg.spike_window = 3;
  DivergenceGuard guard(cfg);
  EXPECT_FALSE(guard.check(step(0, 2.0)));
  EXPECT_FALSE(guard.check(step(1, 50.0)));  // window not full yet: no median to compare with
  DivergenceGuard fresh(cfg);
  for (double loss : {2.0, 2.2, 2.1}) EXPECT_FALSE(fresh.check(step(0, loss)));
  const auto trip = fresh.check(step(3, 25.0));
  ASSERT_TRUE(trip);
  EXPECT_EQ(trip->quantity, "loss spike");
  EXPECT_NE(trip->reason.find("median 2.1 of the last 3 steps"), std::string::npos) << trip->reason;
  // The tripped loss did not join the window: 20 is under 10 x 2.1 and joins it.
  EXPECT_FALSE(fresh.check(step(4, 20.0)));
  EXPECT_EQ(fresh.window(), (std::vector<double>{2.2, 2.1, 20.0}));
}

// A resumed run judges its next step by the window the checkpoint kept.
TEST(DivergenceGuard, ARestoredWindowJudgesTheNextStepAsTheUninterruptedRunWould) {
  GuardConfig cfg;
  cfg.spike_factor = 10;
  cfg.spike_window = 3;
  DivergenceGuard guard(cfg);
  guard.restore_window({1.0, 2.0, 2.0, 2.0});  // longer than the window: the oldest goes
  EXPECT_EQ(guard.window(), (std::vector<double>{2.0, 2.0, 2.0}));
  EXPECT_TRUE(guard.check(step(9, 21.0)));
}

}  // namespace
}  // namespace deepen
