// Row-chunked distillation loss (fused kernel and ATen ops): values and gradients equal the unchunked autograd version.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <tuple>

#include "config/input_error.h"
#include "tests/test_support.h"
#include "tests/train/distill_loss_support.h"
#include "train/distill_loss.h"

namespace deepen {
namespace {

using at::Tensor;
using namespace loss_test;

std::string describe(double alpha, double tau, int64_t chunk) {
  return "alpha=" + std::to_string(alpha) + " tau=" + std::to_string(tau) + " chunk=" + std::to_string(chunk);
}

TEST(DistillLoss, FullLogitsMatchUnchunkedAutogradInFp32) {
  const Problem p = make_problem(37, 16, 1001);
  for (double alpha : {1.0, 0.5, 0.0}) {
    for (double tau : {1.0, 2.0, 0.7}) {
      for (int64_t chunk : {97, 256, 1001, 4096}) {
        DistillLossOptions o{alpha, tau, chunk, TopkTail::kRenormalize, -100};
        const auto t = TeacherTargets::full(p.teacher_logits);
        expect_matches_reference(p, t, forms(o, chunk, 37), describe(alpha, tau, chunk));
      }
    }
  }
}

// The hidden-state channel: the student gets the teacher's final hidden states g and its head U and
// makes t = g·Uᵀ one chunk of rows at a time; the full-logit channel sends t = g·Uᵀ made in one
// [N, Ht]·[Ht, V] matmul. The two differ only in how each t_j's Ht products are summed (BLAS
// blocks a chunk's matmul differently from the whole one), so both are within the derived fp32
// bound of the exact (fp64) loss and gradients, which derived_bounds extends by that teacher-logit
// rounding (2·γ_Ht·max_j Σ_k |g_k||u_jk| / τ per log-probability); hence they are within the sum of
// the two bounds of each other. Checked for loss, KL, CE and the gradients w.r.t. the student's
// hidden states and head, over α, τ and chunk sizes that do and do not divide N.
TEST(DistillLoss, HiddenStateTargetsGiveTheFullLogitLossAndGradientsInFp32) {
  const int64_t n = 37, h = 16, v = 1001, teacher_h = 24;
  const Problem p = make_problem(n, h, v);
  torch::manual_seed(7);
  const Tensor g = torch::randn({n, teacher_h});  // unit-RMS, as after the teacher's final norm
  const Tensor head = torch::randn({v, teacher_h}) * (2.0 / std::sqrt(static_cast<double>(teacher_h)));
  const TeacherTargets hidden = TeacherTargets::from_hidden(g, head);
  const TeacherTargets full = TeacherTargets::full(at::matmul(g, head.t()));  // what the teacher would send
  for (double alpha : {1.0, 0.5}) {
    for (double tau : {1.0, 2.0}) {
      for (int64_t chunk : {97, 1001, 4096}) {
       for (const Form& f : forms({alpha, tau, chunk, TopkTail::kRenormalize, -100}, chunk, n)) {
        const DistillLossOptions& o = f.options;
        const std::string what = "hidden vs full, " + describe(alpha, tau, chunk) + f.name;
        const Result via_hidden = chunked(p, hidden, o, p.labels);
        const Result via_full = chunked(p, full, o, p.labels);
        const Result exact = reference(to_double(p), to_double(hidden), o, p.labels);
        const Bounds b = derived_bounds(p, hidden, o, p.labels, exact);
        const std::pair<const char*, std::tuple<Tensor, Tensor, Tensor, double>> checks[] = {
            {"loss", {via_hidden.loss, via_full.loss, exact.loss, b.loss}},
            {"kl", {via_hidden.kl, via_full.kl, exact.kl, b.kl}},
            {"ce", {via_hidden.ce, via_full.ce, exact.ce, b.ce}},
            {"grad hidden", {via_hidden.grad_hidden, via_full.grad_hidden, exact.grad_hidden, b.grad_hidden}},
            {"grad head", {via_hidden.grad_weight, via_full.grad_weight, exact.grad_weight, b.grad_weight}}};
        for (const auto& [name, c] : checks) {
          const auto& [got_hidden, got_full, ex, bound] = c;
          EXPECT_LE(distance(got_hidden, ex), bound) << what << ": " << name << " (hidden path) vs exact";
          EXPECT_LE(distance(got_full, ex), bound) << what << ": " << name << " (full path) vs exact";
          EXPECT_LE(distance(got_hidden, got_full), 2 * bound) << what << ": " << name;
        }
        EXPECT_GT(exact.kl.item<double>(), 0.1) << what;  // a teacher the student disagrees with
       }
      }
    }
  }
  // And the unchunked reference takes hidden targets too (it materializes g·Uᵀ once).
  expect_matches_reference(p, hidden, forms({1.0, 1.0, 97, TopkTail::kRenormalize, -100}, 97, n), "hidden vs reference");
}

TEST(DistillLoss, HiddenStateTargetsOfTheWrongShapeAreNamed) {
  const Problem p = make_problem(4, 8, 50);
  const DistillLossOptions o;
  auto error_of = [&](const TeacherTargets& t) {
    try {
      distill_loss(p.hidden, p.weight, t, {}, o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(TeacherTargets::from_hidden(torch::randn({4, 6}), torch::randn({49, 6}))).find("student's vocabulary 50"),
            std::string::npos);
  EXPECT_NE(error_of(TeacherTargets::from_hidden(torch::randn({4, 5}), torch::randn({50, 6}))).find("teacher head's width 6"),
            std::string::npos);
}

TEST(DistillLoss, TopkRenormalizeMatchesUnchunkedAutogradInFp32) {
  const Problem p = make_problem(29, 16, 777, at::kFloat, 1);
  for (int64_t k : {1, 8, 64}) {
    const TeacherTargets t = teacher_topk(p.teacher_logits, k, 1.5);
    for (double alpha : {1.0, 0.3}) {
      for (int64_t chunk : {50, 128, 777}) {
        DistillLossOptions o{alpha, 1.5, chunk, TopkTail::kRenormalize, -100};
        expect_matches_reference(p, t, forms(o, chunk, 29), "k=" + std::to_string(k) + " " + describe(alpha, 1.5, chunk));
      }
    }
  }
}

TEST(DistillLoss, TopkBucketMatchesUnchunkedAutogradInFp32) {
  const Problem p = make_problem(29, 16, 777, at::kFloat, 2);
  for (int64_t k : {1, 8, 64}) {
    for (double tau : {1.0, 3.0}) {
      const TeacherTargets t = teacher_topk(p.teacher_logits, k, tau);
      for (double alpha : {1.0, 0.6}) {
        for (int64_t chunk : {50, 128, 777}) {
          DistillLossOptions o{alpha, tau, chunk, TopkTail::kBucket, -100};
          expect_matches_reference(p, t, forms(o, chunk, 29), "k=" + std::to_string(k) + " " + describe(alpha, tau, chunk));
        }
      }
    }
  }
}

TEST(DistillLoss, AllTargetKindsMatchTightlyInFp64) {
  // In double precision any difference in the math (not rounding) would show far above 1e-12.
  // Derived: the fp32 analysis above with u = 2^-53 (H = 8, V = 101, logit scale A ≤ 10.6 here, the
  // fp64 reference's own sums over V alike) bounds either side's error by (2H + 6 + V)·u·10.6 ≈
  // 1.5e-13 absolute; the values compared are O(1) (KL ≥ 0.55, CE ≈ 6.2 for the full logits), so
  // 1e-12 relative is above the bound.
  const Problem p = make_problem(23, 8, 101, at::kDouble, 3);
  for (double alpha : {1.0, 0.25}) {
    for (double tau : {1.0, 2.5}) {
      for (int64_t chunk : {1, 33, 101}) {
        for (const Form& f : forms({alpha, tau, chunk, TopkTail::kRenormalize, -100}, chunk, 23)) {
          const std::string d = describe(alpha, tau, chunk) + f.name;
          DistillLossOptions o = f.options;
          const auto full = TeacherTargets::full(p.teacher_logits);
          expect_same(chunked(p, full, o, p.labels), reference(p, full, o, p.labels), 1e-12, "full " + d);
          const auto topk = teacher_topk(p.teacher_logits, 10, tau);
          expect_same(chunked(p, topk, o, p.labels), reference(p, topk, o, p.labels), 1e-12, "renormalize " + d);
          o.tail = TopkTail::kBucket;
          expect_same(chunked(p, topk, o, p.labels), reference(p, topk, o, p.labels), 1e-12, "bucket " + d);
        }
      }
    }
  }
}

TEST(DistillLoss, TopkOverTheWholeVocabularyIsTheFullKl) {
  // With k = V nothing is cut off: renormalizing changes nothing, so top-k equals full logits
  // (fp64, bounded as in AllTargetKindsMatchTightlyInFp64).
  const Problem p = make_problem(11, 8, 64, at::kDouble, 4);
  for (const Form& f : forms({0.7, 2.0, 10, TopkTail::kRenormalize, -100}, 10, 11)) {
    const Result full = chunked(p, TeacherTargets::full(p.teacher_logits), f.options, p.labels);
    const Result topk = chunked(p, teacher_topk(p.teacher_logits, 64, 2.0, 7), f.options, p.labels);
    expect_same(topk, full, 1e-12, "k = V" + f.name);
  }
}

TEST(DistillLoss, BucketKeepsTheTailMassThatRenormalizeDrops) {
  // Teacher: 3 ids hold 0.6 of the mass, the rest is spread. A student equal to the teacher has
  // KL 0 under "bucket" (both tails hold 0.4) but not under "renormalize" (which wants the 0.4 moved
  // into the top 3).
  const int64_t V = 50;
  Tensor t = torch::full({1, V}, std::log(0.4 / 47), torch::kDouble);
  t.index_put_({0, torch::indexing::Slice(0, 3)}, std::log(0.2));
  const Tensor w = torch::eye(V, torch::kDouble);
  const Tensor h = t.clone();  // student logits z = h·Wᵀ = t
  const TeacherTargets topk = teacher_topk(t, 3, 1.0);
  EXPECT_NEAR(topk.values.exp().sum().item<double>(), 0.6, 1e-12);
  DistillLossOptions o;
  o.tail = TopkTail::kBucket;
  EXPECT_NEAR(distill_loss(h, w, topk, {}, o).kl.item<double>(), 0.0, 1e-12);
  o.tail = TopkTail::kRenormalize;
  // KL(q ‖ s) with q = 1/3 on the top 3 and s = 0.2 there: log((1/3)/0.2) = log(5/3).
  EXPECT_NEAR(distill_loss(h, w, topk, {}, o).kl.item<double>(), std::log(5.0 / 3.0), 1e-12);
}

TEST(DistillLoss, Bf16TeacherLogitsMatchTheReference) {
  const Problem p = make_problem(19, 16, 500, at::kFloat, 5);
  const auto t = TeacherTargets::full(p.teacher_logits.to(at::kBFloat16));
  for (const Form& f : forms({0.5, 2.0, 128, TopkTail::kRenormalize, -100}, 128, 19)) {
    const DistillLossOptions& o = f.options;
    expect_matches_reference(p, t, o, "bf16 teacher" + f.name);
    // int32 top-k indices work like int64.
    TeacherTargets k32 = teacher_topk(p.teacher_logits, 16, 2.0);
    const Result a = chunked(p, k32, o, p.labels);
    k32.indices = k32.indices.to(at::kInt);
    expect_same(chunked(p, k32, o, p.labels), a, 0.0, "int32 indices" + f.name);  // the same operations: bit for bit
  }
}

TEST(DistillLoss, PretrainingLossIsTorchCrossEntropy) {
  const Problem p = make_problem(40, 16, 333, at::kFloat, 6);
  for (const Form& f : forms({0.0, 1.0, 100, TopkTail::kRenormalize, -100}, 100, 40)) {
    const DistillLossOptions& o = f.options;
    SCOPED_TRACE(f.name);
    Tensor labels = p.labels.clone();
    labels.index_put_({torch::indexing::Slice(0, 5)}, -100);
    const Result got = chunked(p, TeacherTargets::none(), o, labels);
    Tensor h = p.hidden.clone().requires_grad_(true);
    Tensor w = p.weight.clone().requires_grad_(true);
    Tensor want = torch::nn::functional::cross_entropy(torch::matmul(h, w.t()), labels);  // ignore_index -100
    want.backward();
    // torch's fp32 cross entropy is one more fp32 computation of the same value: got is within the
    // derived bound of exact, torch within its own measured distance (see derived_bounds).
    const Result exact = reference(to_double(p), TeacherTargets::none(), o, labels);
    const Bounds b = derived_bounds(p, TeacherTargets::none(), o, labels, exact);
    EXPECT_LE(distance(got.loss, want.detach()), b.loss + distance(want.detach(), exact.loss));
    EXPECT_LE(distance(got.grad_hidden, h.grad()), b.grad_hidden + distance(h.grad(), exact.grad_hidden));
    EXPECT_LE(distance(got.grad_weight, w.grad()), b.grad_weight + distance(w.grad(), exact.grad_weight));
    EXPECT_EQ(got.kl.item<double>(), 0.0);
  }
}

TEST(DistillLoss, IgnoredLabelsDropTheirTokensFromBothTerms) {
  const Problem p = make_problem(30, 16, 300, at::kFloat, 7);
  for (const Form& f : forms({0.5, 2.0, 64, TopkTail::kRenormalize, -100}, 64, 30)) {
    const DistillLossOptions& o = f.options;
    SCOPED_TRACE(f.name);
    Tensor labels = p.labels.clone();
    const Tensor ignored = torch::arange(30) % 3 == 0;
    labels.masked_fill_(ignored, -100);
    const auto full = TeacherTargets::full(p.teacher_logits);
    const Result got = chunked(p, full, o, labels);
    expect_matches_reference(p, full, o, "ignore_index", labels);
    // Same as the loss over the kept rows alone.
    const Tensor keep = ignored.logical_not().nonzero().squeeze(1);
    Problem kept{p.hidden.index_select(0, keep), p.weight, p.teacher_logits.index_select(0, keep), labels.index_select(0, keep)};
    const auto kept_full = TeacherTargets::full(kept.teacher_logits);
    const Result sub = chunked(kept, kept_full, o, kept.labels);
    // Both are fp32 computations of the same exact value, each within its derived bound of it.
    const Bounds b = derived_bounds(p, full, o, labels, reference(to_double(p), to_double(full), o, labels));
    const Bounds bs = derived_bounds(kept, kept_full, o, kept.labels,
                                     reference(to_double(kept), to_double(kept_full), o, kept.labels));
    EXPECT_LE(distance(got.loss, sub.loss), b.loss + bs.loss);
    EXPECT_LE(distance(got.grad_weight, sub.grad_weight), b.grad_weight + bs.grad_weight);
    EXPECT_EQ(got.grad_hidden.index({ignored}).abs().max().item<double>(), 0.0);
    DistillLoss counted = distill_loss(p.hidden, p.weight, full, labels, o);
    EXPECT_EQ(counted.tokens.item<int64_t>(), 20);
  }
}

TEST(DistillLoss, BatchShapedInputsAndUpstreamGradientsFlowThrough) {
  // [B, T, H] hidden made by an upstream op; the loss scaled by 3 before backward.
  const Problem p = make_problem(24, 16, 200, at::kFloat, 8);
  for (const Form& f : forms({0.5, 1.0, 64, TopkTail::kRenormalize, -100}, 64, 24)) {
    const DistillLossOptions& o = f.options;
    SCOPED_TRACE(f.name);
    Tensor a = torch::randn({16, 16}).requires_grad_(true);
    Tensor w = p.weight.clone().requires_grad_(true);
    Tensor h = torch::matmul(p.hidden.view({2, 12, 16}), a);
    DistillLoss out = distill_loss(h, w, TeacherTargets::full(p.teacher_logits.view({2, 12, 200})),
                                   p.labels.view({2, 12}), o);
    (out.loss * 3).backward();
    Tensor a2 = a.detach().clone().requires_grad_(true);
    Tensor w2 = p.weight.clone().requires_grad_(true);
    DistillLoss ref = distill_loss_reference(torch::matmul(p.hidden.view({2, 12, 16}), a2).reshape({24, 16}), w2,
                                             TeacherTargets::full(p.teacher_logits), p.labels, o);
    (ref.loss * 3).backward();
    // Both paths see the same fp32 h (the same matmul of the same values); the loss gradients at h
    // differ by at most the derived bound of the chunked one plus the fp32 reference's own error, and
    // a.grad = hiddenᵀ·(3·dloss/dh) carries that through ‖hidden‖ plus one fp32 matmul over the 24
    // rows (γ_24) and the ×3 (u) on each side.
    const Problem at_h{h.detach().reshape({24, 16}), p.weight, p.teacher_logits, p.labels};
    const auto full = TeacherTargets::full(p.teacher_logits);
    const Result exact = reference(to_double(at_h), to_double(full), o, p.labels);
    const Result ref32 = reference(at_h, full, o, p.labels);
    const Bounds b = derived_bounds(at_h, full, o, p.labels, exact);
    const double dgrad_h = b.grad_hidden + distance(ref32.grad_hidden, exact.grad_hidden);
    const Tensor hid = p.hidden.to(at::kDouble);
    const double a_bound = 3 * (hid.norm().item<double>() * dgrad_h +
                                2 * gamma_n(24) * hid.abs().t().matmul(exact.grad_hidden.abs()).norm().item<double>()) +
                           2 * kU * a2.grad().to(at::kDouble).norm().item<double>();
    const double w_bound = 3 * (b.grad_weight + distance(ref32.grad_weight, exact.grad_weight)) +
                           2 * kU * w2.grad().to(at::kDouble).norm().item<double>();
    EXPECT_LE(distance(a.grad(), a2.grad()), a_bound);
    EXPECT_LE(distance(w.grad(), w2.grad()), w_bound);
    EXPECT_FALSE(out.kl.requires_grad());
  }
}

TEST(DistillLoss, Bf16StudentStaysCloseToFp32) {
  const Problem p = make_problem(32, 64, 400, at::kFloat, 9);
  for (const Form& f : forms({0.5, 2.0, 128, TopkTail::kRenormalize, -100}, 128, 32)) {
    const DistillLossOptions& o = f.options;
    SCOPED_TRACE(f.name);
    const auto full = TeacherTargets::full(p.teacher_logits);
    const Result f32 = chunked(p, full, o, p.labels);
    Problem b = p;
    b.hidden = p.hidden.to(at::kBFloat16);
    b.weight = p.weight.to(at::kBFloat16);
    const Result b16 = chunked(b, full, o, p.labels);
    EXPECT_EQ(b16.grad_hidden.scalar_type(), at::kBFloat16);
    EXPECT_EQ(b16.grad_weight.scalar_type(), at::kBFloat16);
    // What running in bf16 may move the loss and gradients by (bf16_perturbation, derived there),
    // plus the fp32 run's own derived error.
    const Bounds pert = bf16_perturbation(p, full, o);
    const Bounds b32 = derived_bounds(p, full, o, p.labels, reference(to_double(p), to_double(full), o, p.labels));
    const double loss_bound = pert.loss + b32.loss, gh_bound = pert.grad_hidden + b32.grad_hidden,
                 gw_bound = pert.grad_weight + b32.grad_weight;
    EXPECT_LE(distance(b16.loss, f32.loss), loss_bound);
    EXPECT_LE(distance(b16.grad_hidden, f32.grad_hidden), gh_bound);
    EXPECT_LE(distance(b16.grad_weight, f32.grad_weight), gw_bound);
    // And the bound is no blank cheque: within 15% of the fp32 values (bf16 is ~2.5 decimal digits).
    EXPECT_LE(loss_bound / std::abs(f32.loss.item<double>()), 0.15);
  }
}

TEST(DistillLoss, BadInputsAreNamed) {
  const Problem p = make_problem(4, 8, 50);
  DistillLossOptions o;
  const auto msg = test::error_of;
  EXPECT_NE(msg([&] { distill_loss(p.hidden, p.weight, TeacherTargets::full(torch::zeros({4, 49})), p.labels, o); })
                .find("teacher logits [4, 49] do not match 4 tokens × the student's vocabulary 50"),
            std::string::npos);
  EXPECT_NE(msg([&] { distill_loss(p.hidden, p.weight, TeacherTargets::none(), p.labels, o); }).find("alpha > 0 needs teacher"),
            std::string::npos);
  o.alpha = 0.5;
  EXPECT_NE(msg([&] { distill_loss(p.hidden, p.weight, TeacherTargets::full(p.teacher_logits), torch::full({4}, 50, torch::kLong), o); })
                .find("label id outside the vocabulary [0, 50)"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              distill_loss(p.hidden, p.weight, TeacherTargets::topk(torch::zeros({4, 2}), torch::full({4, 2}, 60, torch::kLong)),
                           p.labels, o);
            }).find("top-k index outside the vocabulary"),
            std::string::npos);
  DistillConfig cfg;
  cfg.tail = TopkTail::kBucket;
  cfg.row_chunk = 123;
  EXPECT_EQ(distill_loss_options(cfg).tail, TopkTail::kBucket);
  EXPECT_EQ(distill_loss_options(cfg).row_chunk, 123);
}

}  // namespace
}  // namespace deepen
