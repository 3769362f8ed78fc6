// The distillation loss tests' shared parts: a problem, a loss run with autograd, the exact (fp64)
// values, and the fp32 error bounds derived from the arithmetic that every comparison uses.
#pragma once

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "train/distill_loss.h"

namespace deepen::loss_test {

using at::Tensor;

// ‖a − b‖ / ‖b‖, the relative error of a whole tensor.
inline double rel(const Tensor& a, const Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm().clamp_min(1e-300)).item<double>();
}

struct Problem {
  Tensor hidden, weight, teacher_logits, labels;
};

// Student logits with std ~2 and a teacher that disagrees with it: a realistic, well-scaled case.
inline Problem make_problem(int64_t n, int64_t h, int64_t v, at::ScalarType dtype = at::kFloat, uint64_t seed = 0) {
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

inline Result run(const LossFn& fn, const Problem& p, const TeacherTargets& teacher, const DistillLossOptions& o,
           const Tensor& labels) {
  Tensor h = p.hidden.detach().clone().requires_grad_(true);
  Tensor w = p.weight.detach().clone().requires_grad_(true);
  DistillLoss out = fn(h, w, teacher, labels, o);
  out.loss.backward();
  return {out.loss.detach(), out.kl, out.ce, h.grad(), w.grad()};
}

inline Result chunked(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o, const Tensor& labels) {
  return run([](const Tensor& h, const Tensor& w, const TeacherTargets& tt, const Tensor& y,
                const DistillLossOptions& oo) { return distill_loss(h, w, tt, y, oo); },
             p, t, o, labels);
}
inline Result reference(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o, const Tensor& labels) {
  return run(distill_loss_reference, p, t, o, labels);
}

inline void expect_same(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_LE(rel(got.loss, want.loss), tol) << what << ": loss " << got.loss.item<double>() << " vs " << want.loss.item<double>();
  EXPECT_LE(rel(got.kl, want.kl), tol) << what << ": kl";
  EXPECT_LE(rel(got.ce, want.ce), tol) << what << ": ce";
  EXPECT_LE(rel(got.grad_hidden, want.grad_hidden), tol) << what << ": grad hidden";
  EXPECT_LE(rel(got.grad_weight, want.grad_weight), tol) << what << ": grad weight";
  EXPECT_GT(want.grad_hidden.norm().item<double>(), 0) << what;
}

// The loss's paths a sweep checks at one chunk size: rows in chunks of 1 + chunk % n_rows (sizes that
// do and do not divide n) through the fused CPU kernel and through ATen ops (the path of other
// devices), and the automatic chunk through the fused kernel.
struct Form {
  std::string name;
  DistillLossOptions options;
};
inline std::vector<Form> forms(const DistillLossOptions& base, int64_t chunk, int64_t n_rows) {
  DistillLossOptions fused = base, aten = base, whole = base;
  fused.row_chunk = aten.row_chunk = 1 + chunk % n_rows;
  fused.kernels = whole.kernels = CpuKernels::kFused;
  aten.kernels = CpuKernels::kAten;
  whole.row_chunk = 0;
  const std::string rows = std::to_string(fused.row_chunk);
  return {{" row_chunk=" + rows + " fused", fused}, {" row_chunk=" + rows + " aten", aten}, {" row_chunk=auto fused", whole}};
}

inline Problem to_double(const Problem& p) {
  return {p.hidden.to(at::kDouble), p.weight.to(at::kDouble), p.teacher_logits.to(at::kDouble), p.labels};
}
inline TeacherTargets to_double(const TeacherTargets& t) {
  if (t.is_hidden()) return TeacherTargets::from_hidden(t.hidden.to(at::kDouble), t.head.to(at::kDouble));
  if (t.is_sampled()) return TeacherTargets::sampled(t.sample_ids, t.sample_weights.to(at::kDouble), t.entropy.to(at::kDouble));
  return t.is_full() ? TeacherTargets::full(t.logits.to(at::kDouble))
                     : TeacherTargets::topk(t.values.to(at::kDouble), t.indices);
}

// ---- fp32 tolerances, derived from the arithmetic (not fitted to one CPU's rounding) -------------
// u = 2^-24 is fp32's unit roundoff: an fp32 +, −, ×, ÷ is exact up to a factor (1 + δ), |δ| ≤ u; a
// sum or dot product of n terms in ANY order (blocked, vectorized with 8 or 16 lanes, FMA or not) errs
// by at most γ_n = n·u/(1 − n·u) times the sum of the terms' absolute values (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., §3.1); exp is within 1 ulp (≤ 2u relative: glibc and
// ATen's vectorized kernels alike). These are worst cases of that model, so they hold on Intel
// AVX-512 and AMD AVX2 alike; the AMD failure this replaces (4.24e-6 against a fitted 1.26e-6) was a
// KL value checked against a slack measured on the gradients only.
//
// The chunked loss against the exact value (fp64 arithmetic on the same fp32 inputs), per row r; the
// fused CPU kernel and the ATen ops (each row's log-sum-exp over the whole vocabulary at once) do
// the operations counted here or fewer (the vocabulary-chunked loss this replaced, with its online
// log-sum-exp and its per-chunk sums of grad_h, passed the same bounds):
//  - logits x_j = fl(fl(h·w_j)/τ): ≤ γ_{H+1}·a_j/τ, a_j = Σ_k |h_k||w_jk| (H products, then ÷τ);
//  - log-sum-exp: the shift x_j − m (|x_j − m| ≤ 2A_r) and exp add ≤ 2u·A_r + 2u
//    per term, A_r = max_j a_j/τ; the sums over V and the log run in fp64 (V·2^-53: negligible);
//  - so a student log-probability x_j − L errs by ε_r ≤ (2H + 6)·u·A_r + 2u (x_j and the L it is
//    measured against each carry γ_{H+1}·A_r), and a teacher one (fp32 logits ÷ τ, shift, exp) by
//    ε^T_r ≤ 4u·A^T_r + 2u, A^T_r = max_j |t_j|/τ (top-k targets arrive as log-probabilities and are
//    processed in fp64: no teacher term);
//  - KL_r and CE_r are probability-weighted sums (weights summing to 1) of differences of such
//    log-probabilities, the bucket's tail term using two log-sum-exps: |δKL_r| ≤ 2ε_r + ε^T_r and
//    |δCE_r| ≤ 2ε_r at τ = 1; the means over rows run in fp64, then round to fp32 (+u·|kl|, +u·|ce|;
//    the loss α·τ²·kl + (1 − α)·ce adds 3u·|loss|);
//  - dz = α·τ·(s − target) + (1 − α)·(s₁ − onehot(y)), scaled by 1/n, is formed in fp32 from
//    probabilities exp(fl(x − fl(L))) that err by ≤ 2ε_r + u·(|L| + |x − L|) + 2u ≤ 2ε_r + u·(3A_r +
//    2·ln V) + 2u relative (L rounded to fp32, then the difference; |L| ≤ A_r + ln V), the teacher's
//    likewise by ε^T_r + u·(3A^T_r + 2·ln V) + 2u, and at most 8 more roundings of a term or a
//    partial sum of terms (the coefficients, their three products, two adds, the one-hot, the
//    incoming gradient): |δdz_j| ≤ (2ε_r + ε^T_r + u·(3A_r + 3A^T_r +
//    4·ln V) + 12u)·|dz|_j, where |dz| sums the terms' absolute values (bucket tail: the factor
//    f = (P_K − S_K)/U errs by ≤ 3ε_r·(P_K + S_K)/U, so |dz| counts s_j·(|f| + 3(P_K + S_K)/U) there);
//  - grad_h = dz·W, the V products of one matmul per row: γ_V·|dz|·|W| more;
//    grad_w = dzᵀ·h over the n rows, added chunk of rows by chunk of rows: γ_n·|dz|ᵀ·|h| more.
// The unchunked fp32 reference (autograd through log_softmax over the whole V, fp32 sums over V) is
// itself further from exact; its own error is measured against the fp64 computation, and
// |got − ref32| ≤ |got − exact| + |ref32 − exact| bounds what the two fp32 losses may differ by.
constexpr double kU = 0x1p-24;
inline double gamma_n(double n) { return n * kU / (1 - n * kU); }

struct Bounds {
  double loss = 0, kl = 0, ce = 0, grad_hidden = 0, grad_weight = 0;  // absolute (norms for tensors)
};

inline Bounds derived_bounds(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o, const Tensor& labels,
                      const Result& exact) {
  at::NoGradGuard no_grad;
  const double tau = o.temperature, alpha = o.alpha;
  const Tensor h = p.hidden.to(at::kDouble), w = p.weight.to(at::kDouble);
  const int64_t n_rows = h.size(0), H = h.size(1), V = w.size(0);
  const Tensor valid = labels.defined() ? (labels != o.ignore_index).to(at::kDouble) : torch::ones({n_rows}, torch::kDouble);
  const double n = std::max(1.0, valid.sum().item<double>());
  const Tensor z = h.matmul(w.t());
  const Tensor a = h.abs().matmul(w.abs().t());                        // Σ_k |h_k||w_jk|
  const Tensor eps_kl = (2.0 * H + 6) * kU * (std::get<0>(a.max(1)) / tau) + 2 * kU;  // ε_r at τ
  const Tensor eps_ce = (2.0 * H + 6) * kU * std::get<0>(a.max(1)) + 2 * kU;          // ε_r at τ = 1
  Tensor eps_t = torch::zeros({n_rows}, torch::kDouble);
  Tensor dz_abs = torch::zeros({n_rows, V}, torch::kDouble);
  const Tensor s_tau = torch::softmax(z / tau, 1);
  const bool has_kl = !t.empty();            // kl is computed (and reported) whenever there are targets
  const bool kl_part = alpha > 0 && has_kl;  // ... and enters the loss and its gradient when α > 0
  if (has_kl) {
    Tensor target;
    if (t.is_full() || t.is_hidden()) {
      const Tensor tl = t.is_full() ? t.logits.to(at::kDouble) : t.hidden.to(at::kDouble).matmul(t.head.to(at::kDouble).t());
      eps_t = 4 * kU * (std::get<0>(tl.abs().max(1)) / tau) + 2 * kU;
      if (t.is_hidden()) {
        // The teacher logits are themselves made in fp32 (g·u_j, Ht products): each errs by
        // ≤ γ_Ht·Σ_k |g_k||u_jk|, and a log-probability (logit minus log-sum-exp) by twice that.
        const Tensor g = t.hidden.to(at::kDouble), u = t.head.to(at::kDouble);
        eps_t = eps_t + 2 * gamma_n(static_cast<double>(g.size(1))) * std::get<0>(g.abs().matmul(u.abs().t()).max(1)) / tau;
      }
      target = torch::softmax(tl / tau, 1);
      dz_abs = s_tau + target;
    } else if (t.is_sampled()) {
      // Sampled targets arrive as weights (processed in fp64, no teacher term): s^τ·Σw + p̂.
      const Tensor idx = t.sample_ids.to(at::kLong), wt = t.sample_weights.to(at::kDouble);
      dz_abs = s_tau * wt.sum(1, true) + torch::zeros({n_rows, V}, torch::kDouble).scatter_add(1, idx, wt);
    } else {
      const Tensor idx = t.indices.to(at::kLong), v = t.values.to(at::kDouble);
      const Tensor onk = torch::zeros({n_rows, V}, torch::kDouble).scatter(1, idx, 1.0);
      if (o.tail == TopkTail::kRenormalize) {
        dz_abs = s_tau + torch::zeros({n_rows, V}, torch::kDouble).scatter(1, idx, torch::softmax(v, 1));
      } else {
        const Tensor pk_mass = v.exp().sum(1, true), sk_mass = (s_tau * onk).sum(1, true);
        const Tensor tail = (1 - sk_mass).clamp_min(1e-300);
        const Tensor off = s_tau * (((pk_mass - sk_mass).abs() + 3 * (pk_mass + sk_mass)) / tail);
        dz_abs = onk * (s_tau + torch::zeros({n_rows, V}, torch::kDouble).scatter(1, idx, v.exp())) + (1 - onk) * off;
      }
    }
    dz_abs = kl_part ? alpha * tau * dz_abs : torch::zeros_like(dz_abs);
  }
  if (alpha < 1 && labels.defined()) {
    const Tensor onehot = torch::zeros({n_rows, V}, torch::kDouble).scatter(1, labels.clamp_min(0).unsqueeze(1), 1.0);
    dz_abs = dz_abs + (1 - alpha) * (torch::softmax(z, 1) + onehot);
  }
  dz_abs = dz_abs * (valid / n).unsqueeze(1);
  const double log_v = std::log(static_cast<double>(V));
  Tensor shifts = 3 * torch::maximum(std::get<0>(a.max(1)) / tau, std::get<0>(a.max(1))) + 2 * log_v;
  if (t.is_full() || t.is_hidden()) {
    const Tensor tl = t.is_full() ? t.logits.to(at::kDouble) : t.hidden.to(at::kDouble).matmul(t.head.to(at::kDouble).t());
    shifts = shifts + 3 * std::get<0>(tl.abs().max(1)) / tau + 2 * log_v;
  }
  const Tensor eps_dz = (2 * torch::maximum(eps_kl, eps_ce) + eps_t + kU * shifts + 12 * kU).unsqueeze(1);
  auto mean_valid = [&](const Tensor& x) { return (x * valid).sum().item<double>() / n; };
  Bounds b;
  b.kl = has_kl ? mean_valid(2 * eps_kl + eps_t) + kU * std::abs(exact.kl.item<double>()) : 0;
  b.ce = labels.defined() ? mean_valid(2 * eps_ce) + kU * std::abs(exact.ce.item<double>()) : 0;
  b.loss = (kl_part ? alpha * tau * tau * b.kl : 0) + (alpha < 1 ? (1 - alpha) * b.ce : 0) +
           3 * kU * std::abs(exact.loss.item<double>());
  b.grad_hidden = ((eps_dz * dz_abs).matmul(w.abs()).norm().item<double>() +
                   gamma_n(static_cast<double>(V)) * dz_abs.matmul(w.abs()).norm().item<double>());
  b.grad_weight = ((eps_dz * dz_abs).t().matmul(h.abs()).norm().item<double>() +
                   gamma_n(static_cast<double>(n_rows)) * dz_abs.t().matmul(h.abs()).norm().item<double>());
  return b;
}

// How far a bf16 student's loss and gradients may be from the same loss in fp32 (full targets p's
// teacher logits, labels p's, all counted), to first order in bf16's rounding:
// bf16 keeps 8 significant bits, u_b = 2^-8. h and W are rounded to bf16 (u_b each), multiplied
// with fp32 accumulation (γ_H) and the logits rounded to bf16 (u_b): |δz_j| ≤ Δ_j = (3u_b + γ_H)·a_j,
// a_j = Σ_k |h_k||w_jk|. The loss moves by at most Σ_j |dloss/dz_j|·Δ_j to first order, plus
// ½·max_j Δ_j² per row (the curvature of α·τ²·KL(z/τ) and of (1 − α)·CE is at most α and 1 − α).
// A probability moves by a factor within e^{±2·max Δ/τ}, so dz by ≤ α·τ·s^τ·(e^{2max Δ/τ} − 1) +
// (1 − α)·s·(e^{2max Δ} − 1) per row; the gradient matmuls round dz, W (or h) and the bf16
// result (3u_b) and sum in fp32 (γ_V, γ_n). The fp32 arithmetic of the bf16 run is the fp32 run's
// (derived_bounds), which callers add.
inline Bounds bf16_perturbation(const Problem& p, const TeacherTargets& full, const DistillLossOptions& o) {
  at::NoGradGuard no_grad;
  const double ub = 0x1p-8, tau = o.temperature, alpha = o.alpha;
  const int64_t n = p.hidden.size(0), H = p.hidden.size(1), V = p.weight.size(0);
  const Tensor h = p.hidden.to(at::kDouble), w = p.weight.to(at::kDouble);
  const Tensor z = h.matmul(w.t()), delta = (3 * ub + gamma_n(static_cast<double>(H))) * h.abs().matmul(w.abs().t());
  const Tensor s_tau = torch::softmax(z / tau, 1), s1 = torch::softmax(z, 1);
  const Tensor onehot = torch::zeros({n, V}, torch::kDouble).scatter(1, p.labels.unsqueeze(1), 1.0);
  const Tensor dz = (alpha * tau * (s_tau - torch::softmax(full.logits.to(at::kDouble) / tau, 1)) +
                     (1 - alpha) * (s1 - onehot)) / static_cast<double>(n);
  const Tensor max_delta = std::get<0>(delta.max(1, true));
  const Tensor ddz = (alpha * tau * s_tau * ((2 * max_delta / tau).exp() - 1) + (1 - alpha) * s1 * ((2 * max_delta).exp() - 1)) /
                     static_cast<double>(n);
  Bounds b;
  b.loss = (dz.abs() * delta).sum().item<double>() + 0.5 * max_delta.pow(2).mean().item<double>();
  b.grad_hidden = ddz.matmul(w.abs()).norm().item<double>() +
                  (3 * ub + gamma_n(static_cast<double>(V))) * dz.abs().matmul(w.abs()).norm().item<double>();
  b.grad_weight = ddz.t().matmul(h.abs()).norm().item<double>() +
                  (3 * ub + gamma_n(static_cast<double>(n))) * dz.abs().t().matmul(h.abs()).norm().item<double>();
  return b;
}

// ‖a − b‖ (absolute; norm for tensors).
inline double distance(const Tensor& a, const Tensor& b) { return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>(); }

// The chunked loss in fp32, in each of `forms`, against the exact values (the same formulas in fp64
// on the same fp32 inputs), within the derived bounds; and against the unchunked fp32 autograd loss
// within those bounds plus that reference's own measured distance from exact. The references depend
// on α, τ, the tail and ignore_index only, which the forms share: they are made once.
inline void expect_matches_reference(const Problem& p, const TeacherTargets& t, const std::vector<Form>& forms,
                                     const std::string& what, const Tensor& labels = {}) {
  const Tensor y = labels.defined() ? labels : p.labels;
  const DistillLossOptions& o0 = forms.front().options;
  const Result ref32 = reference(p, t, o0, y);
  const Result exact = reference(to_double(p), t.empty() ? t : to_double(t), o0, y);
  for (const Form& f : forms) {
    const DistillLossOptions& o = f.options;
    const Result got = chunked(p, t, o, y);
    const Bounds b = derived_bounds(p, t, o, y, exact);
    const std::pair<const char*, std::tuple<Tensor, Tensor, Tensor, double>> checks[] = {
        {"loss", {got.loss, ref32.loss, exact.loss, b.loss}},
        {"kl", {got.kl, ref32.kl, exact.kl, b.kl}},
        {"ce", {got.ce, ref32.ce, exact.ce, b.ce}},
        {"grad hidden", {got.grad_hidden, ref32.grad_hidden, exact.grad_hidden, b.grad_hidden}},
        {"grad weight", {got.grad_weight, ref32.grad_weight, exact.grad_weight, b.grad_weight}}};
    for (const auto& [name, c] : checks) {
      const auto& [g, r32, ex, bound] = c;
      const double vs_exact = distance(g, ex), ref_own = distance(r32, ex);
      if (std::getenv("DEEPEN_PRINT_BOUNDS"))  // how much of its bound each check uses, for the curious
        std::printf("%s%s: %s: %.2e vs exact = %.3f of the bound %.2e; fp32 reference's own error %.2e\n", what.c_str(),
                    f.name.c_str(), name, vs_exact, vs_exact / bound, bound, ref_own);
      EXPECT_LE(vs_exact, bound) << what << f.name << ": " << name << " vs exact (|exact| "
                                 << ex.to(at::kDouble).norm().item<double>() << ")";
      EXPECT_LE(distance(g, r32), bound + ref_own) << what << f.name << ": " << name << " vs fp32 reference (its own error "
                                                   << ref_own << ")";
    }
  }
  EXPECT_GT(exact.grad_hidden.norm().item<double>(), 0) << what;
}
inline void expect_matches_reference(const Problem& p, const TeacherTargets& t, const DistillLossOptions& o,
                                     const std::string& what, const Tensor& labels = {}) {
  expect_matches_reference(p, t, std::vector<Form>{{"", o}}, what, labels);
}

}  // namespace deepen::loss_test
