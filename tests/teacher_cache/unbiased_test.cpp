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

// Draws are keyed by (seed, token place): N caches of one batch are the batch repeated N times with
// every row a place of its own. The mean over caches of each cache's loss is the loss of the stacked
// batch (a mean over its rows), so its gradient w.r.t. the shared hidden states and head (each copy's
// gradient summed into the one leaf) IS the mean of the N caches' gradients: one loss call per N.
TEST(RsKd, TheMeanSampledGradientConvergesAsOneOverSqrtNWhileTopkStays) {
  torch::manual_seed(0);
  const int64_t n = 8, hdim = 16, V = 300, K = 8, most = 1024;
  const Tensor hidden = torch::randn({n, hdim});
  const Tensor head = torch::randn({V, hdim}) * 0.5;
  const Tensor teacher = torch::randn({n, V}) * 2.0;
  for (double tau : {1.0, 2.0}) {
    const DistillLossOptions o{1.0, tau, 0, TopkTail::kRenormalize, -100};
    const Grad full = gradient(hidden, head, TeacherTargets::full(teacher), o);
    const double topk_error = rel(gradient(hidden, head, teacher_topk(teacher, K, tau), o).g, full.g);
    // Cache i is rows [i·n, (i + 1)·n) of the stacked draws (places i·n + r: independent of each other).
    const TeacherTargets all = sample_teacher_targets(teacher.repeat({most, 1}), tau, K, 17);
    std::vector<std::pair<int, double>> errors;  // (N, relative error of the mean of N caches' gradients)
    for (int N : {16, 64, 256, 1024}) {
      const int64_t rows = N * n;
      const TeacherTargets first = TeacherTargets::sampled(all.sample_ids.narrow(0, 0, rows),
                                                           all.sample_weights.narrow(0, 0, rows), all.entropy.narrow(0, 0, rows));
      Tensor h = hidden.clone().requires_grad_(true), w = head.clone().requires_grad_(true);
      distill_loss(h.repeat({N, 1}), w, first, {}, o).loss.backward();
      errors.emplace_back(N, rel(at::cat({h.grad().flatten(), w.grad().flatten()}).to(at::kDouble), full.g));
    }
    // Least-squares slope of log error on log N: −1/2 for an unbiased estimator of finite variance.
    double mx = 0, my = 0, sxx = 0, sxy = 0;
    for (auto [N, e] : errors) mx += std::log(N) / 4, my += std::log(e) / 4;
    for (auto [N, e] : errors) sxx += std::pow(std::log(N) - mx, 2), sxy += (std::log(N) - mx) * (std::log(e) - my);
    const double slope = sxy / sxx;
    std::printf("tau %.1f: top-%lld error %.4f; sampled K=%lld, mean of N caches: ", tau, (long long)K, topk_error, (long long)K);
    for (auto [N, e] : errors) std::printf("N=%d %.4f  ", N, e);
    std::printf("slope %.3f\n", slope);
    EXPECT_GT(slope, -0.65) << "tau " << tau;
    EXPECT_LT(slope, -0.35) << "tau " << tau;
    EXPECT_LT(errors.back().second, errors.front().second / 4) << "tau " << tau;
    // Top-k's error is a bias: many sampled caches averaged are far closer than it is.
    EXPECT_GT(topk_error, 5 * errors.back().second) << "tau " << tau;
    // KL̂ is unbiased too: the caches' mean KL̂ is within 4 standard errors of the exact KL.
    const Tensor log_s = at::log_softmax(at::matmul(hidden, head.t()).to(at::kDouble) / tau, 1).repeat({most, 1});
    const Tensor kl_rows = (all.sample_weights.to(at::kDouble) * -log_s.gather(1, all.sample_ids)).sum(1) -
                           all.entropy.to(at::kDouble);
    const Tensor per_cache = kl_rows.view({most, n}).mean(1);
    const double mean = per_cache.mean().item<double>(), se = per_cache.std().item<double>() / std::sqrt(double(most));
    EXPECT_NEAR(mean, full.kl, 4 * se + 1e-6) << "tau " << tau;
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
