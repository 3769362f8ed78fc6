// The row-chunked distillation loss: each chunk's logits made once, both gradients made in the forward.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <vector>

#include "train/distill_loss_parts.h"
#include "train/distill_rows.h"
#include "train/loss_chunking.h"

namespace deepen {

at::Tensor DistillLossWorkspace::buffer(size_t slot, int64_t rows, int64_t cols, const at::TensorOptions& options) {
  if (buffers_.size() <= slot) buffers_.resize(slot + 1);
  at::Tensor& b = buffers_[slot];
  const int64_t n = rows * cols;
  if (!b.defined() || b.numel() < n || b.scalar_type() != c10::typeMetaToScalarType(options.dtype()) ||
      b.device() != options.device())
    b = at::empty({n}, options);
  return b.narrow(0, 0, n).view({rows, cols});
}

at::Tensor DistillLossWorkspace::gradient(const at::Tensor& like) {
  const int64_t bytes = like.numel() * static_cast<int64_t>(like.element_size());
  for (const at::Storage& s : gradients_) {
    // Only this workspace holds it: whatever autograd made of the tensor is gone.
    if (s.use_count() == 1 && static_cast<int64_t>(s.nbytes()) >= bytes && s.device() == like.device()) {
      at::Tensor t = at::empty({0}, like.options());
      t.set_(s, 0, like.sizes(), c10::contiguous_strides(like.sizes()));
      return t;
    }
  }
  at::Tensor t = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
  // Two circulate under gradient accumulation: .grad's (the first micro-batch's, stolen by
  // AccumulateGrad) and the one each later micro-batch adds into it.
  if (gradients_.size() < 2) gradients_.push_back(t.storage());
  return t;
}

int64_t DistillLossWorkspace::bytes() const {
  int64_t n = 0;
  for (const at::Tensor& b : buffers_)
    if (b.defined()) n += b.numel() * static_cast<int64_t>(b.element_size());
  for (const at::Storage& s : gradients_) n += static_cast<int64_t>(s.nbytes());
  return n;
}

namespace distill_detail {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Workspace slots.
enum Slot : size_t { kLogits, kTeacher, kLow, kHeadCopy, kGradAccumulator, kWideHidden };

struct RowsOut {
  Tensor loss, kl, ce, tokens, grad_h, grad_w;
};

// log Σ_j e^{a_ij} per row in fp64 (−inf for a row that is all −inf), the shift in a's dtype.
Tensor lse_rows(const Tensor& a) {
  const Tensor m = std::get<0>(a.max(1));
  const Tensor shift = at::where(at::isinf(m), at::zeros_like(m), m);
  const Tensor s = at::sum(at::exp(a - shift.unsqueeze(1)), {1}, false, at::kDouble);
  return shift.to(at::kDouble) + at::log(s);
}

// One chunk's row statistics and dz with ATen ops (other devices, fp64, cpu_kernels = "aten"): the
// fused kernel's formulas (train/distill_rows.cpp) on [r, V] tensors. z: the chunk's logits in the
// compute dtype, dz on return when `gradient`; t: the teacher's chunk (full targets).
void rows_by_ops(const Tensor& z, const Tensor& t, const Prepared& p, int64_t r0, int64_t r, const DistillLossOptions& o,
                 const Tensor& scale, bool gradient, Tensor& kl_out, Tensor& ce_out) {
  const double tau = o.temperature, alpha = o.alpha;
  const bool tau1 = tau == 1.0;
  const bool has_kl = p.mode != Mode::kNone, has_ce = p.labels.defined();
  const bool bucket = p.mode == Mode::kTopk && o.tail == TopkTail::kBucket;
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor valid = p.valid.narrow(0, r0, r);
  const Tensor y = has_ce ? at::where(valid, p.labels.narrow(0, r0, r), 0).unsqueeze(1) : Tensor();
  const Tensor zy = has_ce ? z.gather(1, y).squeeze(1).to(at::kDouble) : Tensor();
  Tensor idx, v, zk, xk, w, wsum;
  if (p.mode == Mode::kSampled) {
    idx = p.t_idx.narrow(0, r0, r);
    w = p.t_weights.narrow(0, r0, r);
    zk = z.gather(1, idx);
    xk = tau1 ? zk : zk / tau;
  }
  if (p.mode == Mode::kTopk) {
    idx = p.t_idx.narrow(0, r0, r);
    v = p.t_values.narrow(0, r0, r).to(at::kDouble);
    zk = z.gather(1, idx);
    xk = tau1 ? zk : zk / tau;
    if (bucket) z.scatter_(1, idx, -inf);  // the row is then the tail alone, as in the fused kernel
  }
  const Tensor x = tau1 ? z : z / tau;
  const Tensor xkd = xk.defined() ? xk.to(at::kDouble) : Tensor();
  Tensor L, T, xt, q, pk, f, kl;
  if (p.mode == Mode::kFull) {
    xt = tau1 ? t : t / tau;
    const Tensor mt = std::get<0>(xt.max(1));
    const Tensor et = at::exp(xt - mt.unsqueeze(1));
    const Tensor st = at::sum(et, {1}, false, at::kDouble);
    const Tensor w = at::sum((xt - x).mul_(et), {1}, false, at::kDouble);
    L = lse_rows(x);
    T = mt.to(at::kDouble) + at::log(st);
    kl = w / st - T + L;
  } else if (p.mode == Mode::kTopk && !bucket) {
    L = lse_rows(x);
    const Tensor logq = at::log_softmax(v, 1);
    q = at::exp(logq);
    kl = at::where(q > 0, q * (logq - xkd), at::zeros_like(q)).sum(1) + L;
  } else if (p.mode == Mode::kSampled) {
    // KL̂ = Σ_j w_j (L − x_j) − H (train/distill_loss.h).
    L = lse_rows(x);
    const Tensor wd = w.to(at::kDouble);
    wsum = wd.sum(1);
    kl = wsum * L - (wd * xkd).sum(1) - p.t_entropy.narrow(0, r0, r);
  } else if (bucket) {
    const Tensor l_tail = lse_rows(x);
    L = at::logaddexp(l_tail, at::logsumexp(xkd, 1));
    const Tensor log_u = l_tail - L;
    pk = at::exp(v);
    const Tensor pk_sum = pk.sum(1), rr = (1 - pk_sum).clamp(0, 1);
    const Tensor sk = at::exp(xkd - L.unsqueeze(1)).sum(1);
    f = at::where(at::isinf(log_u), at::zeros_like(rr), (pk_sum - sk) * at::exp(-log_u));
    const Tensor head = at::where(pk > 0, pk * (v - xkd + L.unsqueeze(1)), at::zeros_like(pk)).sum(1);
    kl = head + at::where(rr > 0, rr * (at::log(rr) - log_u), at::zeros_like(rr));
  }
  Tensor L1;
  if (has_ce) {
    if (has_kl && tau1) L1 = L;
    else if (bucket) L1 = at::logaddexp(lse_rows(z), at::logsumexp(zk.to(at::kDouble), 1));
    else L1 = lse_rows(z);
  }
  if (has_kl) kl_out.copy_(at::where(valid, kl, at::zeros_like(kl)));
  if (has_ce) ce_out.copy_(at::where(valid, L1 - zy, at::zeros_like(zy)));
  if (!gradient) return;

  const at::ScalarType acc = z.scalar_type();
  const Tensor c_kl_d = has_kl ? scale * (alpha * tau) : at::zeros_like(scale);
  const Tensor c_ce_d = has_ce ? scale * (1 - alpha) : at::zeros_like(scale);
  const Tensor c_kl = c_kl_d.to(acc).unsqueeze(1), c_ce = c_ce_d.to(acc).unsqueeze(1);
  const bool share = has_ce && has_kl && tau1;
  Tensor dz;
  if (!has_kl) {
    dz = at::exp(z - L1.to(acc).unsqueeze(1)).mul_(c_ce);
  } else {
    Tensor a = bucket ? c_kl_d * f : p.mode == Mode::kSampled ? c_kl_d * wsum : c_kl_d;
    if (share) a = a + c_ce_d;
    dz = at::exp(x - L.to(acc).unsqueeze(1)).mul_(a.to(acc).unsqueeze(1));
    if (has_ce && !share) dz.add_(at::exp(z - L1.to(acc).unsqueeze(1)).mul_(c_ce));
    if (p.mode == Mode::kFull) dz.sub_(at::exp(xt - T.to(acc).unsqueeze(1)).mul_(c_kl));
    if (p.mode == Mode::kTopk && !bucket) dz.scatter_add_(1, idx, -(c_kl * q.to(acc)));
    if (p.mode == Mode::kSampled) dz.scatter_add_(1, idx, -(c_kl * w.to(acc)));
    if (bucket) {
      Tensor top = c_kl * (at::exp(xk - L.to(acc).unsqueeze(1)) - pk.to(acc));
      if (has_ce) top = top + c_ce * at::exp(zk - L1.to(acc).unsqueeze(1));
      dz.scatter_(1, idx, top);
    }
  }
  if (has_ce) dz.scatter_add_(1, y, -c_ce);
  z.copy_(dz);
}

// One chunk's rows through the fused kernel (CPU, fp32), in parallel over rows.
void rows_fused(const Tensor& z, const Tensor& t, const Prepared& p, int64_t r0, int64_t r, const DistillLossOptions& o,
                double inv_counted, bool gradient, double* kl_out, double* ce_out) {
  using namespace distill_rows;
  RowTask task;
  task.vocab = p.vocab;
  task.alpha = o.alpha;
  task.temperature = o.temperature;
  task.target = p.mode == Mode::kFull      ? Target::kFull
                : p.mode == Mode::kNone    ? Target::kNone
                : p.mode == Mode::kSampled ? Target::kSampled
                : o.tail == TopkTail::kBucket ? Target::kTopkBucket
                                              : Target::kTopkRenormalize;
  task.ce = p.labels.defined();
  task.gradient = gradient;
  float* zp = z.data_ptr<float>();
  const float* tp = t.defined() ? t.data_ptr<float>() : nullptr;
  const bool* valid = p.valid.data_ptr<bool>();
  const int64_t* labels = task.ce ? p.labels.data_ptr<int64_t>() : nullptr;
  const int64_t k = p.mode == Mode::kTopk ? p.t_values.size(1) : p.mode == Mode::kSampled ? p.t_idx.size(1) : 0;
  const float* values = k && p.mode == Mode::kTopk ? p.t_values.data_ptr<float>() : nullptr;
  const float* weights = k && p.mode == Mode::kSampled ? p.t_weights.data_ptr<float>() : nullptr;
  const double* entropy = p.mode == Mode::kSampled ? p.t_entropy.data_ptr<double>() : nullptr;
  const int64_t* ids = k ? p.t_idx.data_ptr<int64_t>() : nullptr;
  const int64_t V = p.vocab;
  at::parallel_for(0, r, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = r0 + i;
      float* zr = zp + i * V;
      if (!valid[row]) {  // counts for nothing: no statistics, zero gradient
        if (gradient) std::fill(zr, zr + V, 0.0f);
        continue;
      }
      Row in;
      in.z = zr;
      in.teacher = tp ? tp + i * V : nullptr;
      in.topk_values = values ? values + row * k : nullptr;
      in.topk_ids = values && ids ? ids + row * k : nullptr;
      in.sample_ids = weights && ids ? ids + row * k : nullptr;
      in.sample_weights = weights ? weights + row * k : nullptr;
      in.entropy = entropy ? entropy[row] : 0.0;
      in.k = k;
      in.label = labels ? labels[row] : 0;
      in.scale = inv_counted;
      const RowResult res = distill_row(task, in);
      kl_out[row] = res.kl;
      ce_out[row] = res.ce;
    }
  });
}

RowsOut compute(const Prepared& p, const DistillLossOptions& o, bool need_h, bool need_w, DistillLossWorkspace& ws) {
  const int64_t N = p.n, V = p.vocab, H = p.hdim;
  const at::ScalarType acc = p.acc;
  const Tensor& h = p.h;
  const at::ScalarType cd = h.scalar_type();  // the matmuls' dtype (bf16 for a bf16 student)
  const bool low = cd != acc;
  const bool cpu = h.device().is_cpu();
  const bool fused = cpu && acc == at::kFloat && o.kernels != CpuKernels::kAten;
  const bool gradient = need_h || need_w;
  const auto acc_opt = h.options().dtype(acc);

  // The head in the matmuls' dtype: an fp32 master of a bf16 student is cast into a kept buffer
  // (the cast autograd would have made and kept for the backward).
  Tensor w_c = p.w;
  if (p.w.scalar_type() != cd) {
    w_c = ws.buffer(kHeadCopy, V, H, p.w.options().dtype(cd));
    w_c.copy_(p.w);
  }
  // The teacher's chunk: read in place from fp32 logits, else made (hidden) or widened (bf16) into a buffer.
  const bool full_in_place = p.t_logits.defined() && p.t_logits.scalar_type() == acc && p.t_logits.is_contiguous();
  const bool teacher_buffer = p.mode == Mode::kFull && !full_in_place;
  const bool teacher_low = p.t_head.defined() && p.t_head.scalar_type() != acc;
  LossChunkShape shape;
  shape.fused = fused;
  shape.full_teacher = p.mode == Mode::kFull;
  shape.teacher_buffer = teacher_buffer;
  shape.low_precision = low || teacher_low;
  shape.compute_bytes = acc == at::kDouble ? 8 : 4;
  const int64_t R = loss_row_chunk(N, V, loss_bytes_per_element(shape), o.row_chunk, loss_chunk_budget(!cpu));

  const Tensor counted = p.valid.sum();
  const Tensor scale = p.valid.to(at::kDouble) / counted.clamp_min(1).to(at::kDouble);  // 1/n on counted rows
  Tensor kl_rows = at::zeros({N}, h.options().dtype(at::kDouble)), ce_rows = at::zeros_like(kl_rows);
  const double inv_counted = fused ? 1.0 / static_cast<double>(std::max<int64_t>(1, counted.item<int64_t>())) : 0.0;

  // Each row's gradient is finished in its chunk: made in hidden's dtype, rounded once.
  Tensor grad_h = need_h ? at::empty({N, H}, h.options()) : Tensor();
  // The head's gradient sums over every chunk: in the compute dtype (fp32 for a bf16 head), handed
  // to autograd in the head's own dtype.
  Tensor grad_w, gw_acc;
  if (need_w) {
    if (p.w.scalar_type() == acc) {
      grad_w = gw_acc = ws.gradient(p.w);
    } else {
      gw_acc = ws.buffer(kGradAccumulator, V, H, acc_opt);
      grad_w = ws.gradient(p.w);
    }
  }

  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r = std::min(R, N - r0);
    const Tensor h_r = h.narrow(0, r0, r);
    Tensor z = ws.buffer(kLogits, r, V, acc_opt);
    if (!low) {
      at::mm_out(z, h_r, w_c.t());
    } else {
      Tensor zl = ws.buffer(kLow, r, V, h.options());
      at::mm_out(zl, h_r, w_c.t());
      z.copy_(zl);
    }
    Tensor t;
    if (p.mode == Mode::kFull) {
      if (full_in_place) {
        t = p.t_logits.narrow(0, r0, r);
      } else {
        t = ws.buffer(kTeacher, r, V, acc_opt);
        if (p.t_logits.defined()) {
          t.copy_(p.t_logits.narrow(0, r0, r));
        } else if (!teacher_low) {
          at::mm_out(t, p.t_hidden.narrow(0, r0, r), p.t_head.t());
        } else {
          Tensor tl = ws.buffer(kLow, r, V, p.t_head.options());
          at::mm_out(tl, p.t_hidden.narrow(0, r0, r), p.t_head.t());
          t.copy_(tl);
        }
      }
    }
    if (fused) {
      rows_fused(z, t, p, r0, r, o, inv_counted, gradient, kl_rows.data_ptr<double>(), ce_rows.data_ptr<double>());
    } else {
      Tensor kl_r = kl_rows.narrow(0, r0, r), ce_r = ce_rows.narrow(0, r0, r);
      rows_by_ops(z, t, p, r0, r, o, scale.narrow(0, r0, r), gradient, kl_r, ce_r);
    }
    if (!gradient) continue;
    // z holds dz now.
    Tensor dz_low;  // dz in the matmuls' dtype, for bf16 GEMMs
    if (low && (need_h || !cpu)) {
      dz_low = ws.buffer(kLow, r, V, h.options());
      dz_low.copy_(z);
    }
    if (need_h) {
      Tensor gh = grad_h.narrow(0, r0, r);
      at::mm_out(gh, low ? dz_low : z, w_c);
    }
    if (need_w) {
      const bool first = r0 == 0;
      if (!low) {
        if (first) at::mm_out(gw_acc, z.t(), h_r);
        else gw_acc.addmm_(z.t(), h_r);
      } else if (cpu) {
        // CPU: an fp32 GEMM on the fp32 dz and the bf16 rows widened (the same products as a bf16
        // GEMM with fp32 accumulation, which ATen offers on CUDA only), so no per-chunk rounding.
        Tensor hw = ws.buffer(kWideHidden, r, H, acc_opt);
        hw.copy_(h_r);
        if (first) at::mm_out(gw_acc, z.t(), hw);
        else gw_acc.addmm_(z.t(), hw);
      } else {
        if (first) at::mm_out(gw_acc, dz_low.t(), h_r, acc);
        else at::addmm_out(gw_acc, gw_acc, dz_low.t(), h_r, acc);
      }
    }
  }
  if (need_w && gw_acc.unsafeGetTensorImpl() != grad_w.unsafeGetTensorImpl()) grad_w.copy_(gw_acc);

  RowsOut out;
  out.kl = (kl_rows * scale).sum().to(acc);
  out.ce = (ce_rows * scale).sum().to(acc);
  out.loss = at::zeros({}, acc_opt);
  if (o.alpha > 0) out.loss = out.loss + o.alpha * o.temperature * o.temperature * out.kl;
  if (o.alpha < 1) out.loss = out.loss + (1 - o.alpha) * out.ce;
  out.tokens = counted;
  out.grad_h = grad_h;
  out.grad_w = grad_w;
  return out;
}

struct RowChunkedFn : public torch::autograd::Function<RowChunkedFn> {
  // h and w are p->h and p->w, passed as tensors so that autograd links them to the graph.
  static variable_list forward(AutogradContext* ctx, const Tensor& h, const Tensor& w, const Prepared* p,
                               const DistillLossOptions* o, bool need_h, bool need_w, DistillLossWorkspace* ws) {
    (void)h;
    (void)w;
    RowsOut r = compute(*p, *o, need_h, need_w, *ws);
    if (r.grad_h.defined()) ctx->saved_data["grad_h"] = r.grad_h;
    if (r.grad_w.defined()) ctx->saved_data["grad_w"] = r.grad_w;
    ctx->mark_non_differentiable({r.kl, r.ce, r.tokens});
    return {r.loss, r.kl, r.ce, r.tokens};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // Taken out of the context, so the returned tensors have one owner and AccumulateGrad can
    // make a first gradient .grad without copying it.
    auto take = [&](const char* key) {
      auto it = ctx->saved_data.find(key);
      if (it == ctx->saved_data.end()) return Tensor();
      Tensor t = it->second.toTensor();
      ctx->saved_data.erase(it);
      return t;
    };
    Tensor gh = take("grad_h"), gw = take("grad_w");
    if ((ctx->needs_input_grad(0) && !gh.defined()) || (ctx->needs_input_grad(1) && !gw.defined()))
      throw std::logic_error(
          "distill loss: backward ran twice through one forward (retain_graph): its gradients are made in the "
          "forward and handed on once");
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    // The loss is usually backpropagated as is (g = 1): no pass over [V, H] then. Checking the
    // value is a host read, so only on CPU; elsewhere the scaling always runs.
    const bool one = g.device().is_cpu() && g.item<double>() == 1.0;
    if (!one) {
      if (gh.defined()) gh.mul_(g);
      if (gw.defined()) gw.mul_(g);
    }
    return {gh, gw, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

DistillLoss row_chunked_loss(const Prepared& p, const DistillLossOptions& o, bool need_h, bool need_w,
                             DistillLossWorkspace* workspace) {
  DistillLossWorkspace local;
  DistillLossWorkspace& ws = workspace ? *workspace : local;
  if (!need_h && !need_w) {
    const RowsOut r = compute(p, o, false, false, ws);
    return {r.loss, r.kl, r.ce, r.tokens};
  }
  const variable_list out = RowChunkedFn::apply(p.h, p.w, &p, &o, need_h, need_w, &ws);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace distill_detail
}  // namespace deepen
