// Fused per-row distillation loss: a few passes over a row held in cache (max, sums, dz) where the
// ATen op sequence makes a dozen over [rows, V] tensors in memory. -O3 with SIMD clones, like
// model/fused_kernels.cpp.
#include "train/distill_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "model/vector_exp.h"

namespace deepen::distill_rows {
namespace {

using kernels::vexp_softmax;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The maximum is the same in any order, so it is taken in 16 lanes: GCC leaves `omp simd
// reduction(max)` over std::max scalar (vmaxss, 0.35 ns an element on an AVX2 EPYC), and vectorizes
// this form. A NaN is skipped either way.
DEEPEN_CLONES
float max_of(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lane[j] = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = kNegInf;
  for (int64_t j = 0; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// x/τ exactly as the ATen path divides a tensor by τ (one fp32 division; none at τ = 1).
template <bool kTau1>
DEEPEN_CLONE_BODY float scaled(float x, float tau) {
  return kTau1 ? x : x / tau;
}

template <bool kTau1>
DEEPEN_CLONE_BODY double sum_exp_impl(const float* z, int64_t n, float tau, float m) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(vexp_softmax(scaled<kTau1>(z[i], tau) - m));
  return s;
}

// Σ_i e^{z_i/τ − m} in fp64; m = max_i fl(z_i/τ).
DEEPEN_CLONES
double sum_exp(const float* z, int64_t n, float tau, float m) {
  return tau == 1.0f ? sum_exp_impl<true>(z, n, tau, m) : sum_exp_impl<false>(z, n, tau, m);
}

template <bool kTau1, bool kKeep>
DEEPEN_CLONE_BODY void full_sums_impl(float* z, const float* t, float* et, int64_t n, float tau, float ms, float mt,
                                      double* out) {
  double ss = 0, st = 0, w = 0;
#pragma omp simd reduction(+ : ss, st, w)
  for (int64_t i = 0; i < n; ++i) {
    const float x = scaled<kTau1>(z[i], tau), u = scaled<kTau1>(t[i], tau);
    const float ez = vexp_softmax(x - ms), e = vexp_softmax(u - mt);
    ss += static_cast<double>(ez);
    st += static_cast<double>(e);
    w += static_cast<double>((u - x) * e);
    if constexpr (kKeep) {
      z[i] = ez;
      et[i] = e;
    }
  }
  out[0] = ss;
  out[1] = st;
  out[2] = w;
}

// Full targets, one pass over both rows (x = z/τ, u = t/τ, e_i = e^{u_i − mt}):
// out = {Σ e^{x_i − ms}, Σ e_i, Σ e_i·(u_i − x_i)}, each in fp64. With `et` (τ = 1 and the gradient
// wanted) the pass also keeps its exps, e^{z_i − ms} over z and e_i in et, so that the gradient pass
// (scale_dz) needs none of its own: two exps an element where recomputing them at the final shifts
// takes four.
DEEPEN_CLONES
void full_sums(float* z, const float* t, float* et, int64_t n, float tau, float ms, float mt, double* out) {
  if (et) full_sums_impl<true, true>(z, t, et, n, tau, ms, mt, out);
  else if (tau == 1.0f) full_sums_impl<true, false>(z, t, et, n, tau, ms, mt, out);
  else full_sums_impl<false, false>(z, t, et, n, tau, ms, mt, out);
}

// z_i <- a·z_i − c·et_i: with z_i = e^{x_i − ms} and et_i = e^{t_i − mt}, a = (its coefficient)/Σe^{x−ms}
// and c = (its coefficient)/Σe^{t−mt} make the softmaxes' difference of write_dz.
DEEPEN_CLONES
void scale_dz(float* z, const float* et, int64_t n, float a, float c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) z[i] = a * z[i] - c * et[i];
}

template <bool kTau1, bool kCe, bool kTeacher>
DEEPEN_CLONE_BODY void dz_impl(float* z, const float* t, int64_t n, float tau, float a, float L, float b, float L1, float c,
                    float T) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float zi = z[i];
    float d = a * vexp_softmax(scaled<kTau1>(zi, tau) - L);
    if constexpr (kCe) d += b * vexp_softmax(zi - L1);
    if constexpr (kTeacher) d -= c * vexp_softmax(scaled<kTau1>(t[i], tau) - T);
    z[i] = d;
  }
}

// z_i <- a·e^{z_i/τ − L} [+ b·e^{z_i − L1} when ce] [− c·e^{t_i/τ − T} when t].
DEEPEN_CLONES
void write_dz(float* z, const float* t, int64_t n, float tau, float a, float L, bool ce, float b, float L1, float c,
              float T) {
  const bool tau1 = tau == 1.0f;
  if (t) {
    if (tau1) ce ? dz_impl<true, true, true>(z, t, n, tau, a, L, b, L1, c, T) : dz_impl<true, false, true>(z, t, n, tau, a, L, b, L1, c, T);
    else ce ? dz_impl<false, true, true>(z, t, n, tau, a, L, b, L1, c, T) : dz_impl<false, false, true>(z, t, n, tau, a, L, b, L1, c, T);
  } else {
    if (tau1) ce ? dz_impl<true, true, false>(z, t, n, tau, a, L, b, L1, c, T) : dz_impl<true, false, false>(z, t, n, tau, a, L, b, L1, c, T);
    else ce ? dz_impl<false, true, false>(z, t, n, tau, a, L, b, L1, c, T) : dz_impl<false, false, false>(z, t, n, tau, a, L, b, L1, c, T);
  }
}

// log Σ_j e^{x_j} over a few fp64 values (−inf when there are none or all are −inf).
double small_lse(const std::vector<double>& x) {
  double m = -std::numeric_limits<double>::infinity();
  for (double v : x) m = std::max(m, v);
  if (std::isinf(m)) return m;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

}  // namespace

DEEPEN_CLONES
void softmax_exp(const float* x, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = vexp_softmax(x[i]);
}

RowResult distill_row(const RowTask& task, const Row& row) {
  const int64_t V = task.vocab;
  float* z = row.z;
  const double tau_d = task.temperature;
  const float tau = static_cast<float>(tau_d);
  const bool tau1 = tau_d == 1.0;
  const bool has_kl = task.target != Target::kNone;
  const bool bucket = task.target == Target::kTopkBucket;
  const bool topk = bucket || task.target == Target::kTopkRenormalize;
  const bool sampled = task.target == Target::kSampled;
  const double inf = std::numeric_limits<double>::infinity();
  RowResult out;
  const float zy = task.ce ? z[row.label] : 0.0f;

  // The student's logits at the teacher's ids, as the whole row is divided (x_K = z_K/τ). Bucket:
  // the ids are masked out of the row, which is then the tail alone (its sums need no 1 − Σ_K).
  std::vector<double> zk, xk;
  if (sampled) {
    // The student's logits at the drawn ids, divided as the whole row is (x = z/τ).
    xk.resize(static_cast<size_t>(row.k));
    for (int64_t j = 0; j < row.k; ++j) {
      const float v = z[row.sample_ids[j]];
      xk[static_cast<size_t>(j)] = tau1 ? v : v / tau;
    }
  }
  if (topk) {
    zk.resize(static_cast<size_t>(row.k));
    xk.resize(static_cast<size_t>(row.k));
    for (int64_t j = 0; j < row.k; ++j) {
      const float v = z[row.topk_ids[j]];
      zk[static_cast<size_t>(j)] = v;
      xk[static_cast<size_t>(j)] = tau1 ? v : v / tau;
      if (bucket) z[row.topk_ids[j]] = kNegInf;
    }
  }
  const float mz = max_of(z, V);        // bucket: the tail's max (−inf when k = V)
  const float ms = tau1 ? mz : mz / tau;  // max_i fl(z_i/τ): dividing by τ > 0 keeps the order

  double L = 0, T = 0, kl = 0, log_u = -inf;
  std::vector<double> target;  // top-k: q_j (renormalize) or p_j (bucket)
  // Full targets at τ = 1 with the gradient keep the sums pass's exps (full_sums): the rows' sums are
  // the same, and dz is each kept exp scaled by its coefficient over its sum.
  const bool keep_exps = task.target == Target::kFull && tau1 && task.gradient;
  thread_local std::vector<float> teacher_exps;
  double full[3] = {1, 1, 0};  // full targets: Σ e^{x−ms}, Σ e^{u−mt}, Σ e^{u−mt}·(u − x)
  if (task.target == Target::kFull) {
    const float mt0 = max_of(row.teacher, V);
    const float mt = tau1 ? mt0 : mt0 / tau;
    if (keep_exps && static_cast<int64_t>(teacher_exps.size()) < V) teacher_exps.resize(static_cast<size_t>(V));
    full_sums(z, row.teacher, keep_exps ? teacher_exps.data() : nullptr, V, tau, ms, mt, full);
    L = ms + std::log(full[0]);
    T = mt + std::log(full[1]);
    kl = full[2] / full[1] - T + L;
  } else if (sampled) {
    // KL̂ = Σ_j w_j (L − x_j) − H (train/distill_loss.h); wsum = Σ_j w_j rides at the end of target.
    L = ms + std::log(sum_exp(z, V, tau, ms));
    double wsum = 0, cross = 0;
    for (int64_t j = 0; j < row.k; ++j) {
      const double w = row.sample_weights[j];
      wsum += w;
      cross += w * xk[static_cast<size_t>(j)];
    }
    kl = wsum * L - cross - row.entropy;
    target.push_back(wsum);
  } else if (has_kl) {
    const double s = std::isinf(mz) ? 0.0 : sum_exp(z, V, tau, ms);
    if (!bucket) {
      L = ms + std::log(s);
    } else {
      // The tail's sum (at its own max) plus the top-k terms, at a common shift.
      std::vector<double> terms = xk;
      if (s > 0) terms.push_back(ms + std::log(s));
      L = small_lse(terms);
      if (s > 0) log_u = ms + std::log(s) - L;
    }
    const std::vector<double> v(row.topk_values, row.topk_values + row.k);
    if (!bucket) {
      const double lse_v = small_lse(v);
      for (int64_t j = 0; j < row.k; ++j) {
        const double logq = v[static_cast<size_t>(j)] - lse_v, q = std::exp(logq);
        if (q > 0) kl += q * (logq - xk[static_cast<size_t>(j)]);
        target.push_back(q);
      }
      kl += L;
    } else {
      double pk = 0, sk = 0, head = 0;
      for (int64_t j = 0; j < row.k; ++j) {
        const double p = std::exp(v[static_cast<size_t>(j)]);
        pk += p;
        sk += std::exp(xk[static_cast<size_t>(j)] - L);
        if (p > 0) head += p * (v[static_cast<size_t>(j)] - xk[static_cast<size_t>(j)] + L);
        target.push_back(p);
      }
      const double r = std::clamp(1 - pk, 0.0, 1.0);
      // Off the top k, dKL/dz_i = s^τ_i (1 − r/u)/τ with 1 − r/u = (P_K − S_K)/u: this form keeps
      // the small difference P_K − S_K where r ≈ u (see distill_loss.h); no tail (k = V): 0.
      const double f = std::isinf(log_u) ? 0.0 : (pk - sk) * std::exp(-log_u);
      kl = head + (r > 0 ? r * (std::log(r) - log_u) : 0.0);
      target.push_back(f);  // the tail factor rides at the end
    }
  }
  out.kl = kl;

  double L1 = 0;
  if (task.ce) {
    if (has_kl && tau1) {
      L1 = L;
    } else {
      const double s1 = std::isinf(mz) ? 0.0 : sum_exp(z, V, 1.0f, mz);
      std::vector<double> terms;
      if (s1 > 0) terms.push_back(mz + std::log(s1));
      if (bucket) terms.insert(terms.end(), zk.begin(), zk.end());
      L1 = small_lse(terms);
    }
    out.ce = L1 - zy;
  }
  if (!task.gradient) return out;

  // dz = scale·(α·τ·(s^τ − target) + (1 − α)·(s − onehot(y))); at τ = 1 with both terms one exp
  // serves both (s^τ = s).
  const double c_kl_d = has_kl ? row.scale * task.alpha * tau_d : 0.0;
  const double c_ce_d = task.ce ? row.scale * (1 - task.alpha) : 0.0;
  const float c_kl = static_cast<float>(c_kl_d), c_ce = static_cast<float>(c_ce_d);
  const bool share = task.ce && has_kl && tau1;
  const float Lf = static_cast<float>(L), L1f = static_cast<float>(L1), Tf = static_cast<float>(T);
  switch (task.target) {
    case Target::kNone:
      write_dz(z, nullptr, V, 1.0f, c_ce, L1f, false, 0, 0, 0, 0);
      break;
    case Target::kFull:
      if (keep_exps) {
        // τ = 1: L = ms + log Σ_s and T = mt + log Σ_t, so e^{z−L} = e^{z−ms}/Σ_s and e^{t−T} = e^{t−mt}/Σ_t;
        // CE's softmax is the same as KL's (share, or no CE).
        const double a = (c_kl_d + (task.ce ? c_ce_d : 0.0)) / full[0], c = c_kl_d / full[1];
        scale_dz(z, teacher_exps.data(), V, static_cast<float>(a), static_cast<float>(c));
      } else {
        write_dz(z, row.teacher, V, tau, share ? static_cast<float>(c_kl_d + c_ce_d) : c_kl, Lf, task.ce && !share, c_ce,
                 L1f, c_kl, Tf);
      }
      break;
    case Target::kTopkRenormalize:
      write_dz(z, nullptr, V, tau, share ? static_cast<float>(c_kl_d + c_ce_d) : c_kl, Lf, task.ce && !share, c_ce, L1f,
               0, 0);
      for (int64_t j = 0; j < row.k; ++j) z[row.topk_ids[j]] -= c_kl * static_cast<float>(target[static_cast<size_t>(j)]);
      break;
    case Target::kSampled: {
      // (s^τ·Σw − p̂)·c_kl: the row's softmax scaled by the weights' sum, then each draw's weight off its id.
      const double wsum = target.back();
      write_dz(z, nullptr, V, tau, static_cast<float>(c_kl_d * wsum + (share ? c_ce_d : 0.0)), Lf, task.ce && !share, c_ce,
               L1f, 0, 0);
      for (int64_t j = 0; j < row.k; ++j) z[row.sample_ids[j]] -= c_kl * row.sample_weights[j];
      break;
    }
    case Target::kTopkBucket: {
      // Off the top k: the tail share s^τ·f (the masked top-k columns come out 0), then each top-k
      // column is written whole: α·τ·(s^τ_j − p_j) + (1 − α)·s_j.
      const double f = target.back();
      const float a = static_cast<float>(c_kl_d * f + (share ? c_ce_d : 0.0));
      write_dz(z, nullptr, V, tau, a, Lf, task.ce && !share, c_ce, L1f, 0, 0);
      for (int64_t j = 0; j < row.k; ++j) {
        const auto sj = static_cast<size_t>(j);
        float d = c_kl * (std::exp(static_cast<float>(xk[sj]) - Lf) - static_cast<float>(target[sj]));
        if (task.ce) d += c_ce * std::exp(static_cast<float>(zk[sj]) - L1f);
        z[row.topk_ids[j]] = d;
      }
      break;
    }
  }
  if (task.ce) z[row.label] -= c_ce;
  return out;
}

}  // namespace deepen::distill_rows
