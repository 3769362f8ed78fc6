// Chunked distillation loss: values and gradients equal the unchunked autograd version.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <tuple>

#include "launch/input_error.h"
#include "train/distill_loss.h"

namespace deepen {
namespace {

using at::Tensor;

// ‖a − b‖ / ‖b‖, the relative error of a whole tensor.
double rel(const Tensor& a, const Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm().clamp_min(1e-300)).item<double>();
}

struct Problem {
  Tensor hidden, weight, teacher_logits, labels;
};

// Student logits with std ~2 and a teacher that disagrees with it: a realistic, well-scaled case.
Problem make_problem(int64_t n, int64_t h, int64_t v, at::ScalarType dtype = at::kFloat, uint64_t seed = 0) {
  torch::manual_seed(seed);
  Problem p;
  p.hidden = torch::randn({n, h}, torch::dtype(dtype));
  p.weight = torch::randn({v, h}, torch::dtype(dtype)) * (2.0 / std::sqrt(static_cast<double>(h)));
  p.teacher_logits = torch::randn({n, v}, torch::dtype(dtype)) * 2.0;
  p.labels = torch::randint(0, v, {n}, torch::kLong);
  return p;
}

struct Result {
  Tensor loss, kl, ce, grad_hidden, grad_weight;
};

using LossFn = std::function<DistillLoss(const Tensor&, const Tensor&, const TeacherTargets&, const Tensor&,
                                         const DistillLossOptions&)>;

Result run(const LossFn& fn, const Problem& p, const TeacherTargets& teacher, const DistillLossOptions& o,
           const Tensor& labels) {
  Tensor h = p.hidden.detach().clone().requires_grad_(true);
  Tensor w = p.weight.detach().clone().requires_grad_(true);
  DistillLoss out = fn(h, w, teacher, labels, o);
  out.loss.backward();
  return {out.loss.detach(), out.kl, out.ce, h.grad(), w.grad()};
}

Result chunked(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o, const Tensor& labels) {
  return run(distill_loss, p, t, o, labels);
}
Result reference(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o, const Tensor& labels) {
  return run(distill_loss_reference, p, t, o, labels);
}

void expect_same(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_LE(rel(got.loss, want.loss), tol) << what << ": loss " << got.loss.item<double>() << " vs " << want.loss.item<double>();
  EXPECT_LE(rel(got.kl, want.kl), tol) << what << ": kl";
  EXPECT_LE(rel(got.ce, want.ce), tol) << what << ": ce";
  EXPECT_LE(rel(got.grad_hidden, want.grad_hidden), tol) << what << ": grad hidden";
  EXPECT_LE(rel(got.grad_weight, want.grad_weight), tol) << what << ": grad weight";
  EXPECT_GT(want.grad_hidden.norm().item<double>(), 0) << what;
}

Problem to_double(const Problem& p) {
  return {p.hidden.to(at::kDouble), p.weight.to(at::kDouble), p.teacher_logits.to(at::kDouble), p.labels};
}
TeacherTargets to_double(const TeacherTargets& t) {
  return t.is_full() ? TeacherTargets::full(t.logits.to(at::kDouble))
                     : TeacherTargets::topk(t.values.to(at::kDouble), t.indices);
}

// The chunked loss in fp32 against the unchunked autograd loss, both in fp32 and evaluated exactly
// (fp64) on the same fp32 inputs: within 1e-6 of the exact values, and within 1e-6 of the fp32
// reference plus that reference's own distance from exact (the bucket tail's gradient is a small
// difference the plain autograd formula loses to fp32 rounding; the chunked one keeps it).
void expect_matches_reference(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o,
                              const std::string& what) {
  const Result got = chunked(p, t, o, p.labels);
  const Result ref32 = reference(p, t, o, p.labels);
  const Result ref64 = reference(to_double(p), to_double(t), o, p.labels);
  expect_same(got, ref64, 1e-6, what + " vs exact");
  const double slack = std::max(rel(ref32.grad_hidden, ref64.grad_hidden), rel(ref32.grad_weight, ref64.grad_weight));
  expect_same(got, ref32, 1e-6 + slack, what + " vs fp32 reference");
}

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
        expect_same(chunked(p, t, o, p.labels), reference(p, t, o, p.labels), 1e-6, describe(alpha, tau, chunk));
        expect_matches_reference(p, t, o, describe(alpha, tau, chunk));
      }
    }
  }
}

TEST(DistillLoss, TopkRenormalizeMatchesUnchunkedAutogradInFp32) {
  const Problem p = make_problem(29, 16, 777, at::kFloat, 1);
  for (int64_t k : {1, 8, 64}) {
    const TeacherTargets t = teacher_topk(p.teacher_logits, k, 1.5);
    for (double alpha : {1.0, 0.3}) {
      for (int64_t chunk : {50, 128, 777}) {
        DistillLossOptions o{alpha, 1.5, chunk, TopkTail::kRenormalize, -100};
        expect_same(chunked(p, t, o, p.labels), reference(p, t, o, p.labels), 1e-6,
                    "k=" + std::to_string(k) + " " + describe(alpha, 1.5, chunk));
        expect_matches_reference(p, t, o, "k=" + std::to_string(k) + " " + describe(alpha, 1.5, chunk));
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
          expect_matches_reference(p, t, o, "k=" + std::to_string(k) + " " + describe(alpha, tau, chunk));
        }
      }
    }
  }
}

TEST(DistillLoss, AllTargetKindsMatchTightlyInFp64) {
  // In double precision any difference in the math (not rounding) would show far above 1e-12.
  const Problem p = make_problem(23, 8, 101, at::kDouble, 3);
  for (double alpha : {1.0, 0.25}) {
    for (double tau : {1.0, 2.5}) {
      for (int64_t chunk : {1, 33, 101}) {
        const std::string d = describe(alpha, tau, chunk);
        DistillLossOptions o{alpha, tau, chunk, TopkTail::kRenormalize, -100};
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

TEST(DistillLoss, TopkOverTheWholeVocabularyIsTheFullKl) {
  // With k = V nothing is cut off: renormalizing changes nothing, so top-k equals full logits.
  const Problem p = make_problem(11, 8, 64, at::kDouble, 4);
  DistillLossOptions o{0.7, 2.0, 10, TopkTail::kRenormalize, -100};
  const Result full = chunked(p, TeacherTargets::full(p.teacher_logits), o, p.labels);
  const Result topk = chunked(p, teacher_topk(p.teacher_logits, 64, 2.0, 7), o, p.labels);
  expect_same(topk, full, 1e-12, "k = V");
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
  DistillLossOptions o{0.5, 2.0, 128, TopkTail::kRenormalize, -100};
  expect_same(chunked(p, t, o, p.labels), reference(p, t, o, p.labels), 1e-6, "bf16 teacher");
  // int32 top-k indices work like int64.
  TeacherTargets k32 = teacher_topk(p.teacher_logits, 16, 2.0);
  const Result a = chunked(p, k32, o, p.labels);
  k32.indices = k32.indices.to(at::kInt);
  expect_same(chunked(p, k32, o, p.labels), a, 0.0, "int32 indices");
}

TEST(DistillLoss, PretrainingLossIsTorchCrossEntropy) {
  const Problem p = make_problem(40, 16, 333, at::kFloat, 6);
  DistillLossOptions o{0.0, 1.0, 100, TopkTail::kRenormalize, -100};
  Tensor labels = p.labels.clone();
  labels.index_put_({torch::indexing::Slice(0, 5)}, -100);
  const Result got = chunked(p, TeacherTargets::none(), o, labels);
  Tensor h = p.hidden.clone().requires_grad_(true);
  Tensor w = p.weight.clone().requires_grad_(true);
  Tensor want = torch::nn::functional::cross_entropy(torch::matmul(h, w.t()), labels);  // ignore_index -100
  want.backward();
  EXPECT_LE(rel(got.loss, want.detach()), 1e-6);
  EXPECT_LE(rel(got.grad_hidden, h.grad()), 1e-6);
  EXPECT_LE(rel(got.grad_weight, w.grad()), 1e-6);
  EXPECT_EQ(got.kl.item<double>(), 0.0);
}

TEST(DistillLoss, IgnoredLabelsDropTheirTokensFromBothTerms) {
  const Problem p = make_problem(30, 16, 300, at::kFloat, 7);
  DistillLossOptions o{0.5, 2.0, 64, TopkTail::kRenormalize, -100};
  Tensor labels = p.labels.clone();
  const Tensor ignored = torch::arange(30) % 3 == 0;
  labels.masked_fill_(ignored, -100);
  const auto full = TeacherTargets::full(p.teacher_logits);
  const Result got = chunked(p, full, o, labels);
  expect_same(got, reference(p, full, o, labels), 1e-6, "ignore_index");
  // Same as the loss over the kept rows alone.
  const Tensor keep = ignored.logical_not().nonzero().squeeze(1);
  Problem kept{p.hidden.index_select(0, keep), p.weight, p.teacher_logits.index_select(0, keep), labels.index_select(0, keep)};
  const Result sub = chunked(kept, TeacherTargets::full(kept.teacher_logits), o, kept.labels);
  EXPECT_LE(rel(got.loss, sub.loss), 1e-6);
  EXPECT_LE(rel(got.grad_weight, sub.grad_weight), 1e-6);
  EXPECT_EQ(got.grad_hidden.index({ignored}).abs().max().item<double>(), 0.0);
  DistillLoss counted = distill_loss(p.hidden, p.weight, full, labels, o);
  EXPECT_EQ(counted.tokens.item<int64_t>(), 20);
}

TEST(DistillLoss, BatchShapedInputsAndUpstreamGradientsFlowThrough) {
  // [B, T, H] hidden made by an upstream op; the loss scaled by 3 before backward.
  const Problem p = make_problem(24, 16, 200, at::kFloat, 8);
  DistillLossOptions o{0.5, 1.0, 64, TopkTail::kRenormalize, -100};
  Tensor a = torch::randn({16, 16}).requires_grad_(true);
  Tensor w = p.weight.clone().requires_grad_(true);
  Tensor h = torch::matmul(p.hidden.view({2, 12, 16}), a);
  DistillLoss out = distill_loss(h, w, TeacherTargets::full(p.teacher_logits.view({2, 12, 200})),
                                 p.labels.view({2, 12}), o);
  (out.loss * 3).backward();
  Tensor a2 = a.detach().clone().requires_grad_(true);
  Tensor w2 = p.weight.clone().requires_grad_(true);
  DistillLoss ref = distill_loss_reference(torch::matmul(p.hidden, a2), w2, TeacherTargets::full(p.teacher_logits),
                                           p.labels, o);
  (ref.loss * 3).backward();
  EXPECT_LE(rel(a.grad(), a2.grad()), 1e-6);
  EXPECT_LE(rel(w.grad(), w2.grad()), 1e-6);
  EXPECT_FALSE(out.kl.requires_grad());
}

TEST(DistillLoss, Bf16StudentStaysCloseToFp32) {
  const Problem p = make_problem(32, 64, 400, at::kFloat, 9);
  DistillLossOptions o{0.5, 2.0, 128, TopkTail::kRenormalize, -100};
  const auto full = TeacherTargets::full(p.teacher_logits);
  const Result f32 = chunked(p, full, o, p.labels);
  Problem b = p;
  b.hidden = p.hidden.to(at::kBFloat16);
  b.weight = p.weight.to(at::kBFloat16);
  const Result b16 = chunked(b, full, o, p.labels);
  EXPECT_EQ(b16.grad_hidden.scalar_type(), at::kBFloat16);
  EXPECT_EQ(b16.grad_weight.scalar_type(), at::kBFloat16);
  EXPECT_LE(rel(b16.loss, f32.loss), 2e-2);
  EXPECT_LE(rel(b16.grad_hidden, f32.grad_hidden), 5e-2);
  EXPECT_LE(rel(b16.grad_weight, f32.grad_weight), 5e-2);
}

TEST(DistillLoss, BadInputsAreNamed) {
  const Problem p = make_problem(4, 8, 50);
  DistillLossOptions o;
  auto msg = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
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
  cfg.tail = "bucket";
  cfg.vocab_chunk = 123;
  EXPECT_EQ(distill_loss_options(cfg).tail, TopkTail::kBucket);
  EXPECT_EQ(distill_loss_options(cfg).vocab_chunk, 123);
}

}  // namespace
}  // namespace deepen
