// deepen's AdamW against LibTorch's torch::optim::AdamW (the same update as PyTorch's): the paper's
// betas (0.9, 0.95), eps 1e-8, weight decay 0 and a decaying setting, matrices decayed and 1-D gains not.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "train/adamw.h"

namespace deepen {
namespace {

// Five steps on a matrix and a gain vector with the same random gradients on both sides, fp64.
// Both sides do the same dozen roundings per element per step in a different order (torch lerps the
// first moment); each step moves a value by at most about lr (|m / (sqrt(v) + eps)| <= ~1 for
// bias-corrected moments), so after 5 steps the sides can differ by about 5 x 12 ulp of lr and of
// the values: 1e-13 absolute on values of order 1 is 10x above that and far below any real
// difference (a wrong bias correction or decay moves values by ~lr = 1e-2 or lr x wd = 1e-3).
void expect_same_as_torch(double lr, double wd) {
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor w0 = torch::randn({4, 3}, f64), g0 = torch::randn({3}, f64) + 1.0;
  torch::Tensor ours_w = w0.clone().requires_grad_(true), ours_g = g0.clone().requires_grad_(true);
  torch::Tensor ref_w = w0.clone().requires_grad_(true), ref_g = g0.clone().requires_grad_(true);

  AdamW ours(AdamWOptions{.weight_decay = wd, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  ours.add("w", ours_w);
  ours.add("g", ours_g);
  // deepen decays matrices only: the gain vector goes in a group without decay.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{ref_w},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd)));
  groups.emplace_back(std::vector<torch::Tensor>{ref_g},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW ref(groups, torch::optim::AdamWOptions(lr));

  for (int step = 0; step < 5; ++step) {
    const torch::Tensor gw = torch::randn({4, 3}, f64) * (step + 1), gg = torch::randn({3}, f64);
    ours_w.mutable_grad() = gw.clone();
    ours_g.mutable_grad() = gg.clone();
    ref_w.mutable_grad() = gw.clone();
    ref_g.mutable_grad() = gg.clone();
    ours.step(lr);
    ref.step();
    EXPECT_LT((ours_w - ref_w).abs().max().item<double>(), 1e-13) << "step " << step << " wd " << wd;
    EXPECT_LT((ours_g - ref_g).abs().max().item<double>(), 1e-13) << "step " << step << " wd " << wd;
  }
  // The parameters moved (the comparison is not between two untouched tensors).
  EXPECT_GT((ours_w - w0).abs().max().item<double>(), lr);
}

TEST(AdamW, MatchesLibTorchsAdamWWithThePapersSettings) { expect_same_as_torch(1e-2, 0.0); }

TEST(AdamW, MatchesLibTorchsAdamWWithDecoupledDecayOnMatricesOnly) { expect_same_as_torch(1e-2, 0.1); }

// A parameter without a gradient (frozen) keeps its value and its state.
TEST(AdamW, AParameterWithoutAGradientIsLeftAlone) {
  const torch::Tensor p0 = torch::randn({2, 2});
  torch::Tensor p = p0.clone().requires_grad_(true);
  AdamW opt(AdamWOptions{});
  opt.add("p", p);
  opt.step(1e-2);
  EXPECT_TRUE(torch::equal(p.detach(), p0));
  for (const auto& [name, t] : opt.state_tensors())
    EXPECT_EQ(t.abs().sum().item<double>(), 0.0) << name;
}

}  // namespace
}  // namespace deepen
