// RS-KD is unbiased, top-k is not, measured: over N independent sampled caches of one batch, the
// mean of the sampled loss's gradient converges to the full-logit gradient with a relative error
// falling as 1/√N, while top-k's error stays where it is; the mean KL̂ converges to the exact KL.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "teacher_cache/teacher_draws.h"
#include "train/distill_loss.h"

namespace deepen {
namespace {

using at::Tensor;

struct Grad {
  Tensor g;  // d loss / d hidden and d loss / d head, flattened together
  double kl = 0;
};

Grad gradient(const Tensor& hidden, const Tensor& head, const TeacherTargets& t, const DistillLossOptions& o) {
  Tensor h = hidden.clone().requires_grad_(true), w = head.clone().requires_grad_(true);
  const DistillLoss l = distill_loss(h, w, t, {}, o);
  l.loss.backward();
  return {at::cat({h.grad().flatten(), w.grad().flatten()}).to(at::kDouble), l.kl.item<double>()};
}

double rel(const Tensor& a, const Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); }

// Draws are keyed by (seed, token place): caches of seeds 1..N are independent draws of the same batch.
TEST(RsKd, TheMeanSampledGradientConvergesAsOneOverSqrtNWhileTopkStays) {
  torch::manual_seed(0);
  const int64_t n = 8, hdim = 16, V = 300, K = 8;
  const Tensor hidden = torch::randn({n, hdim});
  const Tensor head = torch::randn({V, hdim}) * 0.5;
  const Tensor teacher = torch::randn({n, V}) * 2.0;
  for (double tau : {1.0, 2.0}) {
    const DistillLossOptions o{1.0, tau, 0, TopkTail::kRenormalize, -100};
    const Grad full = gradient(hidden, head, TeacherTargets::full(teacher), o);
    const double topk_error = rel(gradient(hidden, head, teacher_topk(teacher, K, tau), o).g, full.g);
    Tensor sum = torch::zeros_like(full.g);
    double kl_sum = 0, kl_sq = 0;
    std::vector<std::pair<int, double>> errors;  // (N, relative error of the mean of N)
    for (int i = 1; i <= 1024; ++i) {
      const Grad s = gradient(hidden, head, sample_teacher_targets(teacher, tau, K, static_cast<uint64_t>(i)), o);
      sum += s.g;
      kl_sum += s.kl;
      kl_sq += s.kl * s.kl;
      if (i == 16 || i == 64 || i == 256 || i == 1024) errors.emplace_back(i, rel(sum / i, full.g));
    }
    // Least-squares slope of log error on log N: −1/2 for an unbiased estimator of finite variance.
    double mx = 0, my = 0, sxx = 0, sxy = 0;
    for (auto [N, e] : errors) mx += std::log(N) / 4, my += std::log(e) / 4;
    for (auto [N, e] : errors) sxx += std::pow(std::log(N) - mx, 2), sxy += (std::log(N) - mx) * (std::log(e) - my);
    const double slope = sxy / sxx;
    std::printf("tau %.1f: top-%lld error %.4f; sampled K=%lld mean of N: ", tau, (long long)K, topk_error, (long long)K);
    for (auto [N, e] : errors) std::printf("N=%d %.4f  ", N, e);
    std::printf("slope %.3f\n", slope);
    EXPECT_GT(slope, -0.65) << "tau " << tau;
    EXPECT_LT(slope, -0.35) << "tau " << tau;
    EXPECT_LT(errors.back().second, errors.front().second / 4) << "tau " << tau;
    // Top-k's error is a bias: many sampled caches averaged are far closer than it is.
    EXPECT_GT(topk_error, 5 * errors.back().second) << "tau " << tau;
    // KL̂ is unbiased too: the mean over 1024 caches is within 4 standard errors of the exact KL.
    const double mean = kl_sum / 1024, sd = std::sqrt(std::max(0.0, kl_sq / 1024 - mean * mean));
    EXPECT_NEAR(mean, full.kl, 4 * sd / std::sqrt(1024.0) + 1e-6) << "tau " << tau;
  }
}

TEST(RsKd, DrawsFollowTheTeacherAndAreAPureFunctionOfTheirPlace) {
  const Tensor logits = torch::tensor({{0.0, 1.0, 2.0, -1e30}}).to(at::kFloat);  // p = softmax; id 3 impossible
  const int64_t K = 200000;
  const TeacherDraws d = draw_from_teacher(logits, 1.0, token_uniforms(7, {{0, 0, 0}}, K));
  const Tensor counts = torch::bincount(d.ids[0], {}, 4).to(at::kDouble) / K;
  const Tensor p = torch::softmax(logits.to(at::kDouble), 1)[0];
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(counts[i].item<double>(), p[i].item<double>(), 5 * std::sqrt(p[i].item<double>() / K)) << "id " << i;
  EXPECT_EQ(counts[3].item<double>(), 0.0);
  EXPECT_TRUE((d.ids[0].slice(0, 1) >= d.ids[0].slice(0, 0, K - 1)).all().item<bool>());  // ascending
  const double h = -(p.narrow(0, 0, 3) * p.narrow(0, 0, 3).log()).sum().item<double>();
  EXPECT_NEAR(d.entropy[0].item<double>(), h, 1e-12);
  // The same place gives the same uniforms; another position, sequence, split or seed others.
  std::vector<double> a(8), b(8);
  token_uniforms(3, {0, 5, 2}, 8, a.data());
  token_uniforms(3, {0, 5, 2}, 8, b.data());
  EXPECT_EQ(a, b);
  for (TokenPlace other : {TokenPlace{0, 5, 3}, TokenPlace{0, 6, 2}, TokenPlace{1, 5, 2}}) {
    token_uniforms(3, other, 8, b.data());
    EXPECT_NE(a, b);
  }
  token_uniforms(4, {0, 5, 2}, 8, b.data());
  EXPECT_NE(a, b);
}

TEST(RsKd, SampledTargetsAreDistinctIdsWithCountOverK) {
  TeacherDraws d;
  d.ids = torch::tensor({{3, 3, 3, 9}, {1, 2, 4, 8}}, torch::kLong);
  d.entropy = torch::tensor({0.5, 1.5}, torch::kDouble);
  const TeacherTargets t = sampled_targets(d);
  EXPECT_TRUE(t.sample_ids.equal(torch::tensor({{3, 9, 0, 0}, {1, 2, 4, 8}}, torch::kLong)));
  EXPECT_TRUE(t.sample_weights.equal(torch::tensor({{0.75f, 0.25f, 0.f, 0.f}, {0.25f, 0.25f, 0.25f, 0.25f}})));
  EXPECT_TRUE(t.entropy.equal(torch::tensor({0.5f, 1.5f})));
}

}  // namespace
}  // namespace deepen
