// The loss's sampled targets (RS-KD, a teacher cache's draws): the row-chunked loss (fused kernel and
// ATen ops) equals the unchunked autograd form within the derived fp32 bounds, and the estimator's
// algebra (weights of repeated ids add; padding weighs nothing; the entropy sets the KL's value only).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "config/input_error.h"
#include "teacher_cache/teacher_draws.h"
#include "tests/test_support.h"
#include "tests/train/distill_loss_support.h"
#include "train/distill_loss.h"

namespace deepen {
namespace {

using at::Tensor;
using namespace loss_test;

TEST(SampledLoss, MatchesUnchunkedAutogradInFp32) {
  const Problem p = make_problem(29, 16, 777, at::kFloat, 3);
  for (int64_t k : {1, 16}) {
    for (double tau : {1.0, 2.0}) {
      const TeacherTargets t = sample_teacher_targets(p.teacher_logits, tau, k, 11);
      for (double alpha : {1.0, 0.3}) {
        for (int64_t chunk : {50}) {
          DistillLossOptions o{alpha, tau, chunk, TopkTail::kRenormalize, -100};
          expect_matches_reference(p, t, forms(o, chunk, 29),
                                   "K=" + std::to_string(k) + " tau=" + std::to_string(tau) + " alpha=" + std::to_string(alpha));
        }
      }
    }
  }
}

TEST(SampledLoss, PaddingRowsAndIgnoredLabelsCountForNothing) {
  const Problem p = make_problem(12, 8, 101, at::kFloat, 4);
  TeacherTargets t = sample_teacher_targets(p.teacher_logits, 1.0, 16, 5);
  Tensor labels = p.labels.clone();
  labels.narrow(0, 8, 4).fill_(-1);
  // Rows 8..11 as a cache pads them: weight 0, id 0, entropy 0.
  t.sample_weights.narrow(0, 8, 4).zero_();
  t.sample_ids.narrow(0, 8, 4).zero_();
  t.entropy.narrow(0, 8, 4).zero_();
  DistillLossOptions o{0.7, 1.0, 5, TopkTail::kRenormalize, -1};
  expect_matches_reference(p, t, forms(o, 5, 12), "padded", labels);
  // The same 8 rows alone give the same loss and head gradient.
  Problem head = p;
  head.hidden = p.hidden.narrow(0, 0, 8);
  head.teacher_logits = p.teacher_logits.narrow(0, 0, 8);
  const TeacherTargets t8 = TeacherTargets::sampled(t.sample_ids.narrow(0, 0, 8), t.sample_weights.narrow(0, 0, 8),
                                                    t.entropy.narrow(0, 0, 8));
  const Result all = chunked(p, t, o, labels), first = chunked(head, t8, o, labels.narrow(0, 0, 8));
  EXPECT_NEAR(all.loss.item<double>(), first.loss.item<double>(), 1e-6);
  EXPECT_LT(rel(all.grad_weight, first.grad_weight), 1e-5);
  EXPECT_EQ(all.grad_hidden.narrow(0, 8, 4).abs().max().item<double>(), 0.0);
}

TEST(SampledLoss, RepeatedIdsWeighAsTheirSum) {
  const Problem p = make_problem(6, 8, 50, at::kFloat, 6);
  const Tensor ids = torch::tensor({3, 3, 9}, torch::kLong).repeat({6, 1});
  const Tensor w = torch::tensor({0.25f, 0.5f, 0.25f}).repeat({6, 1});
  const Tensor merged_ids = torch::tensor({3, 9}, torch::kLong).repeat({6, 1});
  const Tensor merged_w = torch::tensor({0.75f, 0.25f}).repeat({6, 1});
  const Tensor h = torch::full({6}, 1.25f);
  DistillLossOptions o{1.0, 1.0, 0, TopkTail::kRenormalize, -100};
  for (CpuKernels k : {CpuKernels::kFused, CpuKernels::kAten}) {
    o.kernels = k;
    const Result a = chunked(p, TeacherTargets::sampled(ids, w, h), o, {});
    const Result b = chunked(p, TeacherTargets::sampled(merged_ids, merged_w, h), o, {});
    EXPECT_NEAR(a.loss.item<double>(), b.loss.item<double>(), 1e-6);
    EXPECT_LT(rel(a.grad_hidden, b.grad_hidden), 1e-6);
    EXPECT_LT(rel(a.grad_weight, b.grad_weight), 1e-6);
  }
}

// KL̂ = CE(p̂, s^τ) − H: the entropy moves the value, never the gradient.
TEST(SampledLoss, TheEntropySetsTheValueNotTheGradient) {
  const Problem p = make_problem(5, 8, 40, at::kFloat, 7);
  const TeacherTargets t = sample_teacher_targets(p.teacher_logits, 1.0, 8, 9);
  const TeacherTargets shifted = TeacherTargets::sampled(t.sample_ids, t.sample_weights, t.entropy + 2.0f);
  const DistillLossOptions o{1.0, 1.0, 0, TopkTail::kRenormalize, -100};
  const Result a = chunked(p, t, o, {}), b = chunked(p, shifted, o, {});
  EXPECT_NEAR(a.kl.item<double>() - b.kl.item<double>(), 2.0, 1e-5);
  EXPECT_EQ(rel(a.grad_hidden, b.grad_hidden), 0.0);
}

TEST(SampledLoss, MalformedTargetsAreNamed) {
  const Problem p = make_problem(4, 8, 50);
  const DistillLossOptions o;
  auto error = [&](const TeacherTargets& t) { return test::error_of([&] { distill_loss(p.hidden, p.weight, t, {}, o); }); };
  const Tensor ids = torch::zeros({4, 2}, torch::kLong), w = torch::full({4, 2}, 0.5f), h = torch::zeros({4});
  EXPECT_NE(error(TeacherTargets::sampled(ids + 50, w, h)).find("sampled id outside the vocabulary"), std::string::npos);
  EXPECT_NE(error(TeacherTargets::sampled(ids, -w, h)).find("finite and >= 0"), std::string::npos);
  EXPECT_NE(error(TeacherTargets::sampled(ids, w, {})).find("entropy"), std::string::npos);
  EXPECT_NE(error(TeacherTargets::sampled(ids, torch::full({4, 3}, 0.5f), h)).find("must both be"), std::string::npos);
}

}  // namespace
}  // namespace deepen
