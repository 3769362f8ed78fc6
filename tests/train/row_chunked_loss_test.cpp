// The row-chunked loss (gradients made in the forward): equal to the vocabulary-chunked loss for every
// target form within the derived bounds, in fp32 and bf16; accumulation, a frozen head, a tied head.
#include <gtest/gtest.h>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/train/distill_loss_support.h"
#include "train/distill_loss.h"
#include "train/distill_rows.h"

namespace deepen {
namespace {

using at::Tensor;
using namespace loss_test;

// The fused kernel's exp is what every bound below takes to be within 2 ulp (2u relative). Checked on
// every 61st fp32 value in [-87, 0] (18 million; all 1.1 billion give at most 1.43u with FMA
// contraction and 1.39u without), and: 0 below -87 (e^x < 1.7e-38 there) and for -inf.
TEST(DistillRows, KernelExpIsWithinTwoUlpOnTheSoftmaxRange) {
  std::vector<float> x;
  const uint32_t lo = std::bit_cast<uint32_t>(-0.0f), hi = std::bit_cast<uint32_t>(-87.0f);
  for (uint64_t b = lo; b <= hi; b += 61) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  std::vector<float> e(x.size());
  distill_rows::softmax_exp(x.data(), e.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  float at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    const double err = std::abs(e[i] - want) / want;
    if (err > worst) worst = err, at = x[i];
  }
  EXPECT_LE(worst, 2 * kU) << "at x = " << at;
  const float below[] = {-87.5f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()};
  float out[4];
  distill_rows::softmax_exp(below, out, 4);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

// The target forms a loss takes, on one problem.
struct Targets {
  std::string name;
  TeacherTargets targets;
  bool needs_alpha_zero = false;  // no teacher: the CE-only loss
};
std::vector<Targets> every_target_form(const Problem& p, double tau) {
  const int64_t n = p.hidden.size(0), V = p.weight.size(0), ht = 12;
  torch::manual_seed(11);
  const Tensor g = torch::randn({n, ht});
  const Tensor head = torch::randn({V, ht}) * (2.0 / std::sqrt(static_cast<double>(ht)));
  return {{"full", TeacherTargets::full(p.teacher_logits)},
          {"full bf16", TeacherTargets::full(p.teacher_logits.to(at::kBFloat16))},
          {"hidden", TeacherTargets::from_hidden(g, head)},
          {"top-k renormalize", teacher_topk(p.teacher_logits, 9, tau)},
          {"top-k bucket", teacher_topk(p.teacher_logits, 9, tau)},
          {"none (CE)", TeacherTargets::none(), true}};
}

// |got − exact| within the derived bound of got's form, and |got − other| within the sum of both
// forms' bounds (each is within its own of the same exact value).
void expect_within(const Result& got, const Bounds& b_got, const Result& other, const Bounds& b_other, const Result& exact,
                   const std::string& what) {
  const std::tuple<const char*, Tensor, Tensor, Tensor, double, double> checks[] = {
      {"loss", got.loss, other.loss, exact.loss, b_got.loss, b_other.loss},
      {"kl", got.kl, other.kl, exact.kl, b_got.kl, b_other.kl},
      {"ce", got.ce, other.ce, exact.ce, b_got.ce, b_other.ce},
      {"grad hidden", got.grad_hidden, other.grad_hidden, exact.grad_hidden, b_got.grad_hidden, b_other.grad_hidden},
      {"grad weight", got.grad_weight, other.grad_weight, exact.grad_weight, b_got.grad_weight, b_other.grad_weight}};
  for (const auto& [name, g, o, ex, bg, bo] : checks) {
    EXPECT_LE(distance(g, ex), bg) << what << ": " << name << " vs exact";
    EXPECT_LE(distance(g, o), bg + bo) << what << ": " << name << " vs the other form";
  }
}

// The tolerance is derived_bounds' (tests/train/distill_loss_support.h: fp32 rounding of each step
// the loss takes, worst case over any summation order, so the same on AVX-512 and AVX2 machines);
// the row-chunked form does the operations counted there or fewer, summing each grad_h element's V
// products in one matmul (γ_V). Ignored labels, α with and without each term, τ = 1 (one exp serves
// KL and CE) and not, one row per chunk, a few, and the automatic chunk.
TEST(RowChunkedLoss, EveryTargetFormEqualsTheVocabularyChunkedLossInFp32) {
  const Problem p = make_problem(23, 16, 611, at::kFloat, 21);
  Tensor labels = p.labels.clone();
  labels.index_put_({torch::arange(0, 23, 5)}, -100);
  for (double tau : {1.0, 2.5}) {
    for (const Targets& t : every_target_form(p, tau)) {
      for (double alpha : {1.0, 0.6, 0.0}) {
        if (t.needs_alpha_zero && alpha > 0) continue;
        DistillLossOptions old_form{alpha, tau, 97, t.name == "top-k bucket" ? TopkTail::kBucket : TopkTail::kRenormalize, -100};
        old_form.chunking = LossChunking::kVocab;
        const Result old = chunked(p, t.targets, old_form, labels);
        const Result exact = reference(to_double(p), t.targets.empty() ? t.targets : to_double(t.targets), old_form, labels);
        const Bounds b_old = derived_bounds(p, t.targets, old_form, labels, exact);
        for (int64_t rows : {1, 6, 0}) {
          for (CpuKernels kernels : {CpuKernels::kFused, CpuKernels::kAten}) {
            DistillLossOptions o = old_form;
            o.chunking = LossChunking::kRows;
            o.row_chunk = rows;
            o.kernels = kernels;
            const std::string what = t.name + " tau=" + std::to_string(tau) + " alpha=" + std::to_string(alpha) +
                                     " rows=" + std::to_string(rows) + " " + cpu_kernels_name(kernels);
            const Result got = chunked(p, t.targets, o, labels);
            expect_within(got, derived_bounds(p, t.targets, o, labels, exact), old, b_old, exact, what);
            EXPECT_EQ(got.grad_hidden.index({torch::arange(0, 23, 5)}).abs().max().item<double>(), 0.0) << what;
          }
        }
      }
    }
  }
}

// bf16 student: pure bf16 (head and gradient bf16) and bf16-mixed (the fp32 master head passed, its
// gradient fp32). A form's bf16 run is within bf16_perturbation (pert) of its fp32 run, which is
// within derived_bounds (b) of exact, so |rows − vocab| ≤ (pert + b_rows) + b_rows + b_vocab +
// (pert + b_vocab). The master's gradient is the pure one before its final rounding to bf16 (the
// same fp32 sums), and everything else is the pure run's, bit for bit.
TEST(RowChunkedLoss, Bf16StudentEqualsTheVocabularyChunkedLoss) {
  const Problem p = make_problem(32, 64, 400, at::kFloat, 22);
  const auto full = TeacherTargets::full(p.teacher_logits);
  Problem pure = p, mixed = p;
  pure.hidden = mixed.hidden = p.hidden.to(at::kBFloat16);
  pure.weight = p.weight.to(at::kBFloat16);
  mixed.weight = pure.weight.to(at::kFloat);  // the master whose bf16 cast is pure's weight
  for (double tau : {1.0, 2.0}) {
    DistillLossOptions vocab{0.5, tau, 128, TopkTail::kRenormalize, -100};
    vocab.chunking = LossChunking::kVocab;
    const Result exact = reference(to_double(p), to_double(full), vocab, p.labels);
    const Bounds pert = bf16_perturbation(p, full, vocab);
    const Bounds b_vocab = derived_bounds(p, full, vocab, p.labels, exact);
    const Result old = chunked(pure, full, vocab, p.labels);
    for (int64_t rows : {5, 0}) {
      DistillLossOptions o = vocab;
      o.chunking = LossChunking::kRows;
      o.row_chunk = rows;
      const Bounds b_rows = derived_bounds(p, full, o, p.labels, exact);
      const std::string what = "tau=" + std::to_string(tau) + " rows=" + std::to_string(rows);
      const Result got = chunked(pure, full, o, p.labels);
      const Result master = chunked(mixed, full, o, p.labels);
      EXPECT_EQ(got.grad_weight.scalar_type(), at::kBFloat16) << what;
      EXPECT_EQ(master.grad_weight.scalar_type(), at::kFloat) << what;
      EXPECT_EQ(master.grad_hidden.scalar_type(), at::kBFloat16) << what;
      EXPECT_TRUE(at::equal(master.loss, got.loss)) << what;
      EXPECT_TRUE(at::equal(master.grad_hidden, got.grad_hidden)) << what;
      EXPECT_TRUE(at::equal(master.grad_weight.to(at::kBFloat16), got.grad_weight)) << what;
      EXPECT_LE(distance(got.loss, old.loss), 2 * pert.loss + 2 * b_rows.loss + 2 * b_vocab.loss) << what;
      EXPECT_LE(distance(got.grad_hidden, old.grad_hidden),
                2 * pert.grad_hidden + 2 * b_rows.grad_hidden + 2 * b_vocab.grad_hidden) << what;
      EXPECT_LE(distance(got.grad_weight, old.grad_weight),
                2 * pert.grad_weight + 2 * b_rows.grad_weight + 2 * b_vocab.grad_weight) << what;
      EXPECT_LE(distance(master.grad_weight, old.grad_weight),
                2 * pert.grad_weight + 2 * b_rows.grad_weight + 2 * b_vocab.grad_weight) << what;
    }
  }
}

// The trainer's accumulation: each micro-batch's loss weighted by its share of the step's counted
// tokens, backward per micro-batch into the same .grad, twice (a step, the gradients dropped as
// AdamW::zero_grad does, the same step again). With a workspace kept across all of it (its chunk
// buffers, and .grad built on a head-gradient storage autograd has let go of) the gradients are
// bit for bit those of fresh buffers: the same operations on the same values, nothing left over.
// Against plain autograd (distill_loss_reference) accumulated the same way: each micro-batch's
// gradients are within its derived bound (× its weight) plus the reference's own error, and the
// accumulation adds each sum's rounding (u·Σ|g_m|, twice).
TEST(RowChunkedLoss, GradientsAccumulateOverMicroBatchesAsAutogradDoes) {
  const Problem p = make_problem(30, 16, 300, at::kFloat, 23);
  Tensor labels = p.labels.clone();
  labels.index_put_({torch::arange(0, 30, 7)}, -100);
  const auto full = TeacherTargets::full(p.teacher_logits);
  DistillLossOptions o{0.6, 2.0, 64, TopkTail::kRenormalize, -100};
  o.row_chunk = 4;
  const int64_t splits[] = {0, 10, 17, 30};
  const double total = (labels != -100).sum().item<double>();
  struct Grads {
    Tensor h, w;
  };
  auto accumulate = [&](bool use_reference, DistillLossWorkspace* ws) {
    Tensor h = p.hidden.clone().requires_grad_(true);
    Tensor w = p.weight.clone().requires_grad_(true);
    for (int m = 0; m < 3; ++m) {
      const int64_t a = splits[m], len = splits[m + 1] - splits[m];
      const Tensor y = labels.narrow(0, a, len);
      const TeacherTargets t = TeacherTargets::full(p.teacher_logits.narrow(0, a, len));
      const DistillLoss l = use_reference ? distill_loss_reference(h.narrow(0, a, len), w, t, y, o)
                                          : distill_loss(h.narrow(0, a, len), w, t, y, o, ws);
      (l.loss * (l.tokens.item<double>() / total)).backward();
    }
    return Grads{h.grad().clone(), w.grad().clone()};
  };
  DistillLossWorkspace ws;
  const Grads fresh = accumulate(false, nullptr);
  const Grads step1 = accumulate(false, &ws);
  const Grads step2 = accumulate(false, &ws);
  EXPECT_TRUE(at::equal(step1.w, fresh.w));
  EXPECT_TRUE(at::equal(step2.w, fresh.w));
  EXPECT_TRUE(at::equal(step2.h, fresh.h));
  const Grads ref = accumulate(true, nullptr);
  double bound_h = 0, bound_w = 0, abs_w = 0;
  for (int m = 0; m < 3; ++m) {
    const int64_t a = splits[m], len = splits[m + 1] - splits[m];
    const Problem sub{p.hidden.narrow(0, a, len), p.weight, p.teacher_logits.narrow(0, a, len), labels.narrow(0, a, len)};
    const auto t = TeacherTargets::full(sub.teacher_logits);
    const Result exact = reference(to_double(sub), to_double(t), o, sub.labels);
    const Result ref32 = reference(sub, t, o, sub.labels);
    const Bounds b = derived_bounds(sub, t, o, sub.labels, exact);
    const double share = (sub.labels != -100).sum().item<double>() / total;
    bound_h += share * (b.grad_hidden + distance(ref32.grad_hidden, exact.grad_hidden));
    bound_w += share * (b.grad_weight + distance(ref32.grad_weight, exact.grad_weight));
    abs_w += share * exact.grad_weight.abs().norm().item<double>();
  }
  EXPECT_LE(distance(fresh.h, ref.h), bound_h + 2 * kU * ref.h.norm().item<double>());
  // Each side: two adds into .grad and the weight's product, u·Σ|g_m| each.
  EXPECT_LE(distance(fresh.w, ref.w), bound_w + 2 * 3 * kU * abs_w);
  EXPECT_GT(fresh.w.norm().item<double>(), 0);
}

// Matmuls a call runs, counted by ATen's op-level callbacks (aten::mm, aten::addmm and addmm_, out=
// forms included): what each chunk costs.
struct MatmulCount {
  MatmulCount() {
    handle = at::addThreadLocalCallback(at::RecordFunctionCallback(
        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          const std::string name = fn.name();
          if (name == "aten::mm" || name == "aten::addmm" || name == "aten::addmm_") ++count();
          return nullptr;
        }));
    count() = 0;
  }
  ~MatmulCount() { at::removeCallback(handle); }
  static int64_t& count() {
    static thread_local int64_t n = 0;
    return n;
  }
  at::CallbackHandle handle;
};

// Every logit made once: per chunk of rows one student matmul (h_c·Wᵀ), one teacher matmul with
// hidden-state targets (g_c·Uᵀ), and the two gradient matmuls, where the vocabulary-chunked form
// made each chunk's student and teacher logits again in its backward. The freeze control's frozen
// head skips dzᵀ·h; evaluation (no grad) makes only the logits.
TEST(RowChunkedLoss, EachLogitIsMadeOnceAndAFrozenHeadCostsNoHeadGradient) {
  const Problem p = make_problem(30, 16, 300, at::kFloat, 24);
  torch::manual_seed(5);
  const TeacherTargets hidden = TeacherTargets::from_hidden(torch::randn({30, 8}), torch::randn({300, 8}));
  DistillLossOptions o{0.7, 1.0, 64, TopkTail::kRenormalize, -100};
  o.row_chunk = 8;  // 4 chunks: 8, 8, 8, 6 rows
  auto count = [&](bool head_trains, bool grad) {
    Tensor h = p.hidden.clone().requires_grad_(true);
    Tensor w = p.weight.clone().requires_grad_(head_trains);
    at::AutoGradMode mode(grad);
    MatmulCount mm;
    const DistillLoss l = distill_loss(h, w, hidden, p.labels, o);
    if (grad) l.loss.backward();
    EXPECT_EQ(w.grad().defined(), head_trains && grad);
    EXPECT_EQ(h.grad().defined(), grad);
    return MatmulCount::count();
  };
  EXPECT_EQ(count(true, true), 4 * 4);
  EXPECT_EQ(count(false, true), 4 * 3);
  EXPECT_EQ(count(true, false), 4 * 2);
  // The frozen head changes nothing else: the hidden states' gradient is the same, bit for bit.
  Tensor h1 = p.hidden.clone().requires_grad_(true), h2 = p.hidden.clone().requires_grad_(true);
  distill_loss(h1, p.weight.clone().requires_grad_(true), hidden, p.labels, o).loss.backward();
  distill_loss(h2, p.weight, hidden, p.labels, o).loss.backward();
  EXPECT_TRUE(at::equal(h1.grad(), h2.grad()));
  // Evaluation gives the training call's values, bit for bit, with nothing to backpropagate.
  at::NoGradGuard no_grad;
  const DistillLoss eval = distill_loss(p.hidden, p.weight, hidden, p.labels, o);
  EXPECT_FALSE(eval.loss.requires_grad());
}

// A tied head is the embedding: autograd sums the loss's head gradient and the embedding lookup's,
// as for any weight used twice. So the tied weight's gradient is bit for bit the sum of an untied
// pair's (the same two fp32 tensors added), in fp32 and in bf16-mixed (fp32 master: the lookup's
// bf16 cast and the loss's master gradient both arrive in fp32).
TEST(RowChunkedLoss, TiedHeadGetsTheSumOfBothUses) {
  const Problem p = make_problem(24, 16, 200, at::kFloat, 25);
  const Tensor ids = torch::randint(0, 200, {24}, torch::kLong);
  const Tensor mix = torch::randn({16, 16}) * 0.3;
  const auto full = TeacherTargets::full(p.teacher_logits);
  const DistillLossOptions o{0.5, 2.0, 64, TopkTail::kRenormalize, -100};
  for (at::ScalarType compute : {at::kFloat, at::kBFloat16}) {
    auto hidden_of = [&](const Tensor& embedding) {
      return at::tanh(embedding.to(compute).index_select(0, ids).matmul(mix.to(compute)));
    };
    Tensor tied = p.weight.clone().requires_grad_(true);
    distill_loss(hidden_of(tied), tied, full, p.labels, o).loss.backward();
    Tensor emb = p.weight.clone().requires_grad_(true), head = p.weight.clone().requires_grad_(true);
    distill_loss(hidden_of(emb), head, full, p.labels, o).loss.backward();
    EXPECT_EQ(tied.grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(tied.grad(), emb.grad() + head.grad())) << c10::toString(compute);
    EXPECT_GT(emb.grad().norm().item<double>(), 0);
  }
}

// Memory is the chunk: a call holds R × V fp32 chunk buffers (plus a teacher chunk for hidden-state
// targets) and the head's gradient, and a second call of the same shapes reuses all of it.
TEST(RowChunkedLoss, WorkspaceHoldsTheChunkAndReusesIt) {
  const int64_t n = 30, H = 16, V = 300;
  const Problem p = make_problem(n, H, V, at::kFloat, 26);
  DistillLossOptions o{0.7, 1.0, 64, TopkTail::kRenormalize, -100};
  o.row_chunk = 8;
  DistillLossWorkspace ws;
  for (int call = 0; call < 2; ++call) {
    Tensor h = p.hidden.clone().requires_grad_(true), w = p.weight.clone().requires_grad_(true);
    distill_loss(h, w, TeacherTargets::full(p.teacher_logits), p.labels, o, &ws).loss.backward();
    EXPECT_EQ(ws.bytes(), 8 * V * 4 + V * H * 4) << "call " << call;
  }
  torch::manual_seed(5);
  const TeacherTargets hidden = TeacherTargets::from_hidden(torch::randn({n, 8}), torch::randn({V, 8}));
  Tensor h = p.hidden.clone().requires_grad_(true), w = p.weight.clone().requires_grad_(true);
  distill_loss(h, w, hidden, p.labels, o, &ws).loss.backward();
  EXPECT_EQ(ws.bytes(), 2 * 8 * V * 4 + V * H * 4);
}

TEST(RowChunkedLoss, ASecondBackwardThroughOneForwardIsAnError) {
  const Problem p = make_problem(6, 8, 50, at::kFloat, 27);
  Tensor h = p.hidden.clone().requires_grad_(true);
  const DistillLoss l = distill_loss(h, p.weight, TeacherTargets::full(p.teacher_logits), p.labels,
                                     DistillLossOptions{0.5, 1.0, 64, TopkTail::kRenormalize, -100});
  l.loss.backward({}, /*retain_graph=*/true);
  try {
    l.loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("backward ran twice"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepen
