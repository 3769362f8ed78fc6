// LR schedule: warmup, cosine to the floor, constant, and re-warmup after growth, in worked numbers.
#include <gtest/gtest.h>

#include <cmath>

#include "curriculum/growth_schedule.h"
#include "curriculum/lr_schedule.h"

namespace deepen {
namespace {

LrSchedule example(bool cosine = true) {
  LrSchedule s;
  s.lr = 1.0;
  s.min_lr_ratio = 0.1;
  s.warmup_steps = 2;
  s.cosine = cosine;
  s.total_steps = 6;
  return s;
}

std::vector<double> values(const LrSchedule& s) {
  std::vector<double> out;
  for (int64_t step = 0; step < s.total_steps; ++step) out.push_back(s.at(step));
  return out;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "step " << i;
}

TEST(LrSchedule, WarmupThenCosineReachesTheFloorAtTheLastStep) {
  expect_near(values(example()), {0.5, 1.0, 1.0, 0.775, 0.325, 0.1});
}

TEST(LrSchedule, ConstantAfterWarmup) {
  expect_near(values(example(false)), {0.5, 1.0, 1.0, 1.0, 1.0, 1.0});
}

TEST(LrSchedule, NoWarmupStartsAtFullRate) {
  LrSchedule s = example();
  s.warmup_steps = 0;
  s.total_steps = 3;
  expect_near(values(s), {1.0, 0.55, 0.1});
}

TEST(LrSchedule, RewarmupRampsFromZeroBackToTheBaseAfterEachGrowth) {
  LrSchedule s = example();
  s.growth_steps = {3};
  s.rewarmup_steps = 2;
  expect_near(values(s), {0.5, 1.0, 1.0, 0.3875, 0.325, 0.1});
  // Without re-warmup the growth step changes nothing.
  s.rewarmup_steps = 0;
  expect_near(values(s), values(example()));
}

TEST(LrSchedule, AGrowthInsideARampRestartsIt) {
  LrSchedule s = example(false);
  s.total_steps = 8;
  s.growth_steps = {3, 5};
  s.rewarmup_steps = 4;
  expect_near(values(s), {0.5, 1.0, 1.0, 0.25, 0.5, 0.25, 0.5, 0.75});
}

TEST(LrSchedule, FromConfigFollowsTheGrowthSchedule) {
  CurriculumConfig cur;
  cur.stages = {1, 2, 3};
  cur.stage_steps = {4, 4, 4};
  const GrowthSchedule g = make_growth_schedule(cur, 1024);
  OptimConfig o;
  o.lr = 3e-4;
  o.min_lr_ratio = 0.0;
  o.warmup_steps = 2;
  o.schedule = LrShape::kCosine;
  const LrSchedule s = make_lr_schedule(o, g, 3);
  EXPECT_EQ(s.total_steps, 12);
  EXPECT_EQ(s.growth_steps, (std::vector<int64_t>{4, 8}));
  EXPECT_DOUBLE_EQ(s.at(0), 1.5e-4);
  EXPECT_DOUBLE_EQ(s.at(2), 3e-4);
  // Step 4: first step after growth, base · 1/3. Base at 4 = ½(1 + cos(π·2/9)) · 3e-4.
  const double base4 = 3e-4 * 0.5 * (1 + std::cos(M_PI * 2.0 / 9.0));
  EXPECT_NEAR(s.at(4), base4 / 3.0, 1e-18);
  EXPECT_NEAR(s.at(7), s.base_at(7), 1e-18);
  EXPECT_NEAR(s.at(11), 0.0, 1e-18);
  // Past the end the last value is kept.
  EXPECT_NEAR(s.at(50), s.at(11), 1e-18);
}

TEST(LrSchedule, ResetPolicyRestartsWarmupAndCosineInEveryPhase) {
  LrSchedule s = example();
  s.warmup_steps = 1;
  s.total_steps = 8;
  s.restart_each_phase = true;
  s.phase_begin = {0, 4};
  expect_near(values(s), {1.0, 1.0, 0.55, 0.1, 1.0, 1.0, 0.55, 0.1});
  s.warmup_steps = 2;
  expect_near(values(s), {0.5, 1.0, 1.0, 0.1, 0.5, 1.0, 1.0, 0.1});
}

TEST(LrSchedule, ResetPolicyFromConfigGivesEachPhaseItsOwnSchedule) {
  CurriculumConfig cur;
  cur.stages = {1, 2, 3};
  cur.stage_steps = {3, 5, 4};
  const GrowthSchedule g = make_growth_schedule(cur, 1024);
  OptimConfig o;
  o.lr = 1e-4;
  o.min_lr_ratio = 0.01;  // the paper: 1e-4 -> 1e-6
  o.warmup_steps = 1;
  const LrSchedule s = make_lr_schedule(o, g, 0, /*restart_each_phase=*/true);
  // Each phase starts at the peak after its one warmup step and ends at exactly 1e-6.
  for (int k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(s.at(g.first_step(k)), 1e-4) << "phase " << k;
    EXPECT_NEAR(s.at(g.last_step(k)), 1e-6, 1e-18) << "phase " << k;
  }
  // Phase 1 (steps 3..7, W = 1): progress (local - 1) / 3; step 5 (local 2) is 1e-6 + (1e-4 - 1e-6)·½(1 + cos(π/3)).
  EXPECT_NEAR(s.at(5), 1e-6 + (1e-4 - 1e-6) * 0.75, 1e-18);
}

}  // namespace
}  // namespace deepen
