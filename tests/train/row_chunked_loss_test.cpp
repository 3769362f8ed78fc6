// The row-chunked loss (gradients made in the forward): its fused kernel and ATen ops within the derived
// bounds of exact for every target form; bf16 masters; accumulation, a frozen head, a tied head.
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

// The tolerance is derived_bounds' (tests/train/distill_loss_support.h: fp32 rounding of each step
// the loss takes, worst case over any summation order, so the same on AVX-512 and AVX2 machines).
// The fused kernel and the ATen ops (what other devices run) are each within it of the exact loss,
// so within twice it of each other. Ignored labels, α with and without each term, τ = 1 (one exp
// serves KL and CE) and not, one row per chunk, a few, and the automatic chunk. (The
// vocabulary-chunked loss this replaced met the same bounds on every form, so the two were within
// the sum of their bounds of each other: commit c9239ac's RowChunkedLoss tests, where both ran.)
TEST(RowChunkedLoss, EveryTargetFormMatchesExactThroughTheKernelAndTheAtenOps) {
  const Problem p = make_problem(23, 16, 611, at::kFloat, 21);
  Tensor labels = p.labels.clone();
  labels.index_put_({torch::arange(0, 23, 5)}, -100);
  for (double tau : {1.0, 2.5}) {
    for (const Targets& t : every_target_form(p, tau)) {
      for (double alpha : {1.0, 0.6, 0.0}) {
        if (t.needs_alpha_zero && alpha > 0) continue;
        const DistillLossOptions base{alpha, tau, 0, t.name == "top-k bucket" ? TopkTail::kBucket : TopkTail::kRenormalize, -100};
        const Result exact = reference(to_double(p), t.targets.empty() ? t.targets : to_double(t.targets), base, labels);
        const Bounds b = derived_bounds(p, t.targets, base, labels, exact);
        for (int64_t rows : {1, 6, 0}) {
          DistillLossOptions fused = base, aten = base;
          fused.row_chunk = aten.row_chunk = rows;
          fused.kernels = CpuKernels::kFused;
          aten.kernels = CpuKernels::kAten;
          const std::string what =
              t.name + " tau=" + std::to_string(tau) + " alpha=" + std::to_string(alpha) + " rows=" + std::to_string(rows);
          const Result by_kernel = chunked(p, t.targets, fused, labels), by_ops = chunked(p, t.targets, aten, labels);
          const std::tuple<const char*, Tensor, Tensor, Tensor, double> checks[] = {
              {"loss", by_kernel.loss, by_ops.loss, exact.loss, b.loss},
              {"kl", by_kernel.kl, by_ops.kl, exact.kl, b.kl},
              {"ce", by_kernel.ce, by_ops.ce, exact.ce, b.ce},
              {"grad hidden", by_kernel.grad_hidden, by_ops.grad_hidden, exact.grad_hidden, b.grad_hidden},
              {"grad weight", by_kernel.grad_weight, by_ops.grad_weight, exact.grad_weight, b.grad_weight}};
          for (const auto& [name, k, a, ex, bound] : checks) {
            EXPECT_LE(distance(k, ex), bound) << what << ": " << name << " (kernel) vs exact";
            EXPECT_LE(distance(a, ex), bound) << what << ": " << name << " (ATen ops) vs exact";
            EXPECT_LE(distance(k, a), 2 * bound) << what << ": " << name << " kernel vs ATen ops";
          }
          for (const Result* r : {&by_kernel, &by_ops})
            EXPECT_EQ(r->grad_hidden.index({torch::arange(0, 23, 5)}).abs().max().item<double>(), 0.0) << what;
        }
      }
    }
  }
}

// bf16 student: pure bf16 (head and gradient bf16) and bf16-mixed (the fp32 master head passed, its
// gradient fp32). The master's gradient is the pure one before its final rounding to bf16 (the same
// fp32 sums), and everything else is the pure run's, bit for bit; and both are within
// bf16_perturbation of the fp32 run plus that run's derived error (as DistillLoss.Bf16StudentStaysCloseToFp32).
TEST(RowChunkedLoss, Bf16MasterHeadGetsThePureGradientBeforeItsRounding) {
  const Problem p = make_problem(32, 64, 400, at::kFloat, 22);
  const auto full = TeacherTargets::full(p.teacher_logits);
  Problem pure = p, mixed = p;
  pure.hidden = mixed.hidden = p.hidden.to(at::kBFloat16);
  pure.weight = p.weight.to(at::kBFloat16);
  mixed.weight = pure.weight.to(at::kFloat);  // the master whose bf16 cast is pure's weight
  for (double tau : {1.0, 2.0}) {
    for (int64_t rows : {5, 0}) {
      const DistillLossOptions o{0.5, tau, rows, TopkTail::kRenormalize, -100};
      const std::string what = "tau=" + std::to_string(tau) + " rows=" + std::to_string(rows);
      const Result got = chunked(pure, full, o, p.labels);
      const Result master = chunked(mixed, full, o, p.labels);
      EXPECT_EQ(got.grad_weight.scalar_type(), at::kBFloat16) << what;
      EXPECT_EQ(master.grad_weight.scalar_type(), at::kFloat) << what;
      EXPECT_EQ(master.grad_hidden.scalar_type(), at::kBFloat16) << what;
      EXPECT_TRUE(at::equal(master.loss, got.loss)) << what;
      EXPECT_TRUE(at::equal(master.grad_hidden, got.grad_hidden)) << what;
      EXPECT_TRUE(at::equal(master.grad_weight.to(at::kBFloat16), got.grad_weight)) << what;
      const Result f32 = chunked(p, full, o, p.labels);
      const Bounds pert = bf16_perturbation(p, full, o);
      const Bounds b32 = derived_bounds(p, full, o, p.labels, reference(to_double(p), to_double(full), o, p.labels));
      EXPECT_LE(distance(master.loss, f32.loss), pert.loss + b32.loss) << what;
      EXPECT_LE(distance(master.grad_hidden, f32.grad_hidden), pert.grad_hidden + b32.grad_hidden) << what;
      EXPECT_LE(distance(master.grad_weight, f32.grad_weight), pert.grad_weight + b32.grad_weight) << what;
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
// hidden-state targets (g_c·Uᵀ), and the two gradient matmuls (the vocabulary-chunked loss this
// replaced made each chunk's student and teacher logits again in its backward: 6 per chunk). The freeze control's frozen
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
