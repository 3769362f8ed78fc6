// deepen's AdamW against LibTorch's torch::optim::AdamW (the same update as PyTorch's): the paper's
// betas (0.9, 0.95), eps 1e-8, weight decay 0 and a decaying setting, matrices decayed and 1-D gains not.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <cmath>
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


// fp32 on the CPU takes the one-pass kernel (train/adamw_rows.h): against the same updates in fp64
// (the op sequence, checked against LibTorch above). Per step each element sees about a dozen fp32
// roundings: the parameter's own two (decay, update) at 2^-24 relative each, and those of the update
// lr·m̂/(√v̂ + eps), whose size is at most lr·(1 − β1)/√(1 − β2) ≈ 0.45·lr per unit of gradient ratio
// (≤ lr·3 here): 12 · 2^-24 of that. Over 5 steps: 5 · 2^-24 · (2·max|p| + 36·lr). A wrong bias
// correction or decay moves values by ~lr·0.1 = 1e-3, far above it.
TEST(AdamW, Fp32OnTheCpuIsTheSameUpdateInOnePass) {
  torch::manual_seed(5);
  const double lr = 1e-2, wd = 0.1;
  // 100,003 values: several threads' slices and a vector tail.
  const torch::Tensor w0 = torch::randn({100003, 1}) * 2;
  torch::Tensor ours = w0.clone().requires_grad_(true);
  torch::Tensor ref = w0.to(torch::kFloat64).requires_grad_(true);
  AdamW a(AdamWOptions{.weight_decay = wd, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  AdamW b(AdamWOptions{.weight_decay = wd, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  a.add("w", ours);
  b.add("w", ref);
  for (int step = 0; step < 5; ++step) {
    const torch::Tensor g = torch::randn({100003, 1}) * (step + 1);
    ours.mutable_grad() = g.clone();
    ref.mutable_grad() = g.to(torch::kFloat64);
    a.step(lr);
    b.step(lr);
  }
  const double tol = 5 * std::ldexp(1.0, -24) * (2 * w0.abs().max().item<double>() + 36 * lr);
  EXPECT_LT((ours.to(torch::kFloat64) - ref).abs().max().item<double>(), tol);
  EXPECT_GT((ref - w0.to(torch::kFloat64)).abs().max().item<double>(), lr);
  for (const auto& [name, t] : a.state_tensors()) EXPECT_EQ(t.scalar_type(), name.ends_with(".step") ? torch::kLong : torch::kFloat) << name;
}

// An element's update does not depend on where a slice of the tensor starts (sharded optimizers
// update slices at any offset): the kernel on a whole tensor and on slices at odd offsets agree
// bit for bit.
TEST(AdamW, Fp32SlicesAtAnyOffsetUpdateBitForBitAsTheWhole) {
  torch::manual_seed(6);
  const int64_t n = 4099;
  const torch::Tensor p0 = torch::randn({n}), g = torch::randn({n}), m0 = torch::randn({n}) * 0.1,
                      v0 = torch::rand({n}) * 0.01;
  const AdamWOptions o{.weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  torch::Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  adamw_update(p, g, m, v, 3, 1e-2, true, o);
  torch::Tensor ps = p0.clone(), ms = m0.clone(), vs = v0.clone();
  const std::vector<int64_t> cuts = {0, 7, 1000, 1003, 4090, n};
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    const int64_t begin = cuts[k], end = cuts[k + 1];
    adamw_update(ps.narrow(0, begin, end - begin), g.narrow(0, begin, end - begin), ms.narrow(0, begin, end - begin),
                 vs.narrow(0, begin, end - begin), 3, 1e-2, true, o);
  }
  EXPECT_TRUE(torch::equal(p, ps));
  EXPECT_TRUE(torch::equal(m, ms));
  EXPECT_TRUE(torch::equal(v, vs));
  EXPECT_FALSE(torch::equal(p, p0));
}

}  // namespace
}  // namespace deepen
