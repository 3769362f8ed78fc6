// Transition-aligned loss: jump, AUC and recovery on synthetic curves whose answers are known.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "diagnostics/transition_loss.h"

namespace deepen {
namespace {

TEST(TransitionLoss, WindowsKeepThePapersFractionsOfAPhase) {
  const TransitionWindows paper = transition_windows(50000);
  EXPECT_EQ(paper.short_steps, 1000);
  EXPECT_EQ(paper.long_steps, 5000);
  EXPECT_EQ(paper.smooth_steps, 200);
  const TransitionWindows small = transition_windows(100);
  EXPECT_EQ(small.short_steps, 2);
  EXPECT_EQ(small.long_steps, 10);
  EXPECT_EQ(small.smooth_steps, 1);
  const TransitionWindows demo = transition_windows(600);
  EXPECT_EQ(demo.short_steps, 12);
  EXPECT_EQ(demo.long_steps, 60);
  EXPECT_EQ(demo.smooth_steps, 2);
  EXPECT_THROW(transition_windows(0), std::invalid_argument);
}

TEST(TransitionLoss, HeaderExample) {
  const std::vector<double> loss = {4, 3, 2, 2, 5, 3, 1.5, 1};
  const TransitionLoss r = transition_loss(loss, 0, 4, 8, {2, 4, 1});
  EXPECT_EQ(r.baseline, 2.0);
  EXPECT_EQ(r.jump, 3.0);
  EXPECT_EQ(r.auc_short, 4.0);
  EXPECT_EQ(r.auc_short_steps, 2);
  EXPECT_EQ(r.auc_long, 3.0 + 1.0 - 0.5 - 1.0);
  ASSERT_TRUE(r.recovery_steps.has_value());
  EXPECT_EQ(*r.recovery_steps, 3);
}

// A curve with a known answer at the paper's scale: 2,000 steps flat at 2.0 before the append;
// after it the loss is 2.0 + 1.5·exp(−k/500) − 0.3·k/50000. Baseline 2.0 exactly (a flat window),
// jump 1.5, and the sums and the recovery have closed forms computed here independently of the
// implementation's running sums.
TEST(TransitionLoss, ExponentialRecoveryAtThePapersScale) {
  const int64_t before = 2000, phase = 50000;
  std::vector<double> loss(before, 2.0);
  const auto after = [](int64_t k) { return 2.0 + 1.5 * std::exp(-k / 500.0) - 0.3 * k / 50000.0; };
  for (int64_t k = 0; k < phase; ++k) loss.push_back(after(k));
  const std::vector<TransitionLoss> all = transition_losses(loss, {0, before}, {3, 6}, before + phase);
  ASSERT_EQ(all.size(), 1u);
  const TransitionLoss& r = all[0];
  EXPECT_EQ(r.step, before);
  EXPECT_EQ(r.windows.smooth_steps, 200);
  EXPECT_EQ(r.baseline, 2.0);
  EXPECT_DOUBLE_EQ(r.jump, 1.5);
  // Σ_{k<n} 1.5 q^k = 1.5 (1 − q^n) / (1 − q), q = e^{−1/500}; Σ_{k<n} 0.3 k / 50000 = 0.3 n(n−1)/2 / 50000.
  const double q = std::exp(-1 / 500.0);
  const auto auc = [&](double n) { return 1.5 * (1 - std::pow(q, n)) / (1 - q) - 0.3 * n * (n - 1) / 2 / 50000; };
  // The sums add ~5000 terms of O(1): rounding of a few ulps each, far below 1e-9 relative.
  EXPECT_NEAR(r.auc_short, auc(1000), 1e-9 * 1000);
  EXPECT_NEAR(r.auc_long, auc(5000), 1e-9 * 5000);
  EXPECT_EQ(r.auc_short_steps, 1000);
  EXPECT_EQ(r.auc_long_steps, 5000);
  // The smoothed loss over steps k−199..k is back at 2.0 at the first k with
  //   1.5 q^{k−199} (1 − q^200) / (1 − q) / 200 <= 0.3 (k − 99.5) / 50000;
  // scan it directly.
  int64_t expect = -1;
  for (int64_t k = 199; k < phase; ++k) {
    const double mean_excess = 1.5 * std::pow(q, static_cast<double>(k - 199)) * (1 - std::pow(q, 200.0)) / (1 - q) / 200 -
                               0.3 * (static_cast<double>(k) - 99.5) / 50000;
    if (mean_excess <= 0) {
      expect = k + 1;
      break;
    }
  }
  ASSERT_GT(expect, 0);
  ASSERT_TRUE(r.recovery_steps.has_value());
  // The closed form and the running sum may disagree only where the excess is within rounding of 0.
  EXPECT_NEAR(static_cast<double>(*r.recovery_steps), static_cast<double>(expect), 1.0);
}

TEST(TransitionLoss, ALossThatNeverComesBackHasNoRecoveryAndWindowsStopAtThePhaseEnd) {
  // Stage 0: steps 0..9 at 1.0; stage 1: steps 10..14 at 3.0; stage 2: 15..19 back at 0.5.
  std::vector<double> loss(10, 1.0);
  loss.insert(loss.end(), 5, 3.0);
  loss.insert(loss.end(), 5, 0.5);
  const std::vector<TransitionLoss> all = transition_losses(loss, {0, 10, 15}, {1, 2, 3}, 20);
  ASSERT_EQ(all.size(), 2u);
  // The phase of 5 steps gives windows {1, 1, 1}: its AUC covers step 10 alone.
  EXPECT_EQ(all[0].baseline, 1.0);
  EXPECT_EQ(all[0].jump, 2.0);
  EXPECT_EQ(all[0].auc_long, 2.0);
  EXPECT_FALSE(all[0].recovery_steps.has_value());  // 3.0 until the next append
  // Second append: baseline 3.0 (the previous phase only), drops at once.
  EXPECT_EQ(all[1].baseline, 3.0);
  EXPECT_EQ(all[1].jump, -2.5);
  EXPECT_EQ(all[1].recovery_steps, 1);
}

TEST(TransitionLoss, WindowsAreCutAtThePhaseEnd) {
  std::vector<double> loss(10, 1.0);
  loss.insert(loss.end(), 3, 2.0);
  const TransitionLoss r = transition_loss(loss, 0, 10, 13, {5, 50, 2});
  EXPECT_EQ(r.auc_short_steps, 3);
  EXPECT_EQ(r.auc_short, 3.0);
  EXPECT_EQ(r.auc_long_steps, 3);
}

TEST(TransitionLoss, ARunInProgressReportsOnlyTheAppendsItReached) {
  const std::vector<double> loss(12, 1.0);
  EXPECT_EQ(transition_losses(loss, {0, 10, 20}, {1, 2, 3}, 30).size(), 1u);
  EXPECT_TRUE(transition_losses(loss, {0}, {3}, 12).empty());  // joint: no append
  // A long joint control restarts its LR at step 6 at the same depth: not an append.
  EXPECT_TRUE(transition_losses(loss, {0, 6}, {9, 9}, 12).empty());
}

TEST(TransitionLoss, BadStagesAreRejected) {
  const std::vector<double> loss(12, 1.0);
  EXPECT_THROW(transition_losses(loss, {1, 10}, {1, 2}, 12), std::invalid_argument);
  EXPECT_THROW(transition_losses(loss, {0, 5, 5}, {1, 2, 3}, 12), std::invalid_argument);
  EXPECT_THROW(transition_losses(loss, {0, 5}, {1}, 12), std::invalid_argument);
  EXPECT_THROW(transition_loss(loss, 0, 0, 12, {1, 1, 1}), std::invalid_argument);
  EXPECT_THROW(transition_loss(loss, 0, 5, 13, {1, 1, 1}), std::invalid_argument);
}

}  // namespace
}  // namespace deepen
