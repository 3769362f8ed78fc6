// The distillation loss's entry: inputs checked, the row- or vocabulary-chunked form run; the reference and top-k.
#include "train/distill_loss.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "config/input_error.h"
#include "train/distill_loss_parts.h"

namespace deepen {
namespace distill_detail {

using at::Tensor;

std::string shape_of(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

Prepared prepare(const Tensor& hidden, const Tensor& weight, const TeacherTargets& teacher, const Tensor& labels,
                 const DistillLossOptions& o) {
  const std::string where = "distill loss: ";
  if (!(o.alpha >= 0 && o.alpha <= 1)) throw InputError(where + "alpha must be in [0, 1], got " + std::to_string(o.alpha));
  if (!(o.temperature > 0)) throw InputError(where + "temperature must be > 0, got " + std::to_string(o.temperature));
  if (o.vocab_chunk < 1) throw InputError(where + "vocab_chunk must be >= 1, got " + std::to_string(o.vocab_chunk));
  if (o.row_chunk < 0) throw InputError(where + "row_chunk must be >= 0 (0 = auto), got " + std::to_string(o.row_chunk));
  if (!hidden.defined() || hidden.dim() < 1) throw InputError(where + "hidden states are missing");
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != hidden.size(-1))
    throw InputError(where + "head weight " + (weight.defined() ? shape_of(weight) : "(none)") +
                     " does not match hidden states " + shape_of(hidden) + " (expected [V, H])");
  // A bf16 (or fp16) student may hand its fp32 master head: the loss multiplies in hidden's dtype.
  const bool master = weight.scalar_type() == at::kFloat &&
                      (hidden.scalar_type() == at::kBFloat16 || hidden.scalar_type() == at::kHalf);
  if (weight.scalar_type() != hidden.scalar_type() && !master)
    throw InputError(where + "head weight " + std::string(c10::toString(weight.scalar_type())) + " does not go with " +
                     c10::toString(hidden.scalar_type()) + " hidden states (same dtype, or an fp32 master for bf16)");
  Prepared p;
  p.hdim = hidden.size(-1);
  p.vocab = weight.size(0);
  p.h = hidden.reshape({-1, p.hdim});
  p.n = p.h.size(0);
  p.w = weight;
  p.acc = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (int{teacher.is_full()} + int{teacher.is_topk()} + int{teacher.is_hidden()} > 1)
    throw InputError(where + "teacher targets must be one of full, top-k or hidden");
  if (o.alpha > 0 && teacher.empty()) throw InputError(where + "alpha > 0 needs teacher targets");
  if (o.alpha < 1 && !labels.defined()) throw InputError(where + "alpha < 1 needs labels for the CE term");
  if (teacher.is_full()) {
    p.mode = Mode::kFull;
    const Tensor& t = teacher.logits;
    if (t.dim() < 1 || t.size(-1) != p.vocab || t.numel() != p.n * p.vocab)
      throw InputError(where + "teacher logits " + shape_of(t) + " do not match " + std::to_string(p.n) +
                       " tokens × the student's vocabulary " + std::to_string(p.vocab));
    if (!at::isFloatingType(t.scalar_type())) throw InputError(where + "teacher logits must be floating point");
    p.t_logits = t.reshape({p.n, p.vocab});
  } else if (teacher.is_hidden()) {
    // Full logits that arrive as their two factors: every later step is the full form's.
    p.mode = Mode::kFull;
    const Tensor& g = teacher.hidden;
    const Tensor& u = teacher.head;
    if (!u.defined() || u.dim() != 2 || u.size(0) != p.vocab)
      throw InputError(where + "teacher head " + (u.defined() ? shape_of(u) : "(none)") +
                       " does not match the student's vocabulary " + std::to_string(p.vocab) + " (expected [V, Ht])");
    if (g.dim() < 1 || g.size(-1) != u.size(1) || g.numel() != p.n * u.size(1))
      throw InputError(where + "teacher hidden states " + shape_of(g) + " do not match " + std::to_string(p.n) +
                       " tokens × the teacher head's width " + std::to_string(u.size(1)));
    if (!at::isFloatingType(g.scalar_type()) || !at::isFloatingType(u.scalar_type()))
      throw InputError(where + "teacher hidden states and head must be floating point");
    p.t_hidden = g.reshape({p.n, u.size(1)});
    // One dtype for the matmul: the head's (the teacher's compute dtype); a bf16 wire is widened.
    if (p.t_hidden.scalar_type() != u.scalar_type()) p.t_hidden = p.t_hidden.to(u.scalar_type());
    p.t_head = u;
  } else if (teacher.is_topk()) {
    p.mode = Mode::kTopk;
    const Tensor& v = teacher.values;
    const Tensor& idx = teacher.indices;
    if (!idx.defined() || v.sizes() != idx.sizes() || v.dim() < 1 || v.numel() != p.n * v.size(-1))
      throw InputError(where + "top-k values " + shape_of(v) + " and indices " +
                       (idx.defined() ? shape_of(idx) : "(none)") + " must both be [" + std::to_string(p.n) + ", k]");
    if (idx.scalar_type() != at::kLong && idx.scalar_type() != at::kInt)
      throw InputError(where + "top-k indices must be int64 or int32");
    const int64_t k = v.size(-1);
    if (k < 1 || k > p.vocab) throw InputError(where + "top-k k = " + std::to_string(k) + " outside [1, " + std::to_string(p.vocab) + "]");
    p.t_values = v.reshape({p.n, k}).to(p.acc).contiguous();
    p.t_idx = idx.reshape({p.n, k}).to(at::kLong).contiguous();
    if (((p.t_idx < 0) | (p.t_idx >= p.vocab)).any().item<bool>())
      throw InputError(where + "top-k index outside the vocabulary [0, " + std::to_string(p.vocab) + ")");
  }
  if (labels.defined()) {
    if (labels.numel() != p.n || !at::isIntegralType(labels.scalar_type(), false))
      throw InputError(where + "labels " + shape_of(labels) + " must be " + std::to_string(p.n) + " integer ids");
    p.labels = labels.reshape({p.n}).to(at::kLong).contiguous();
    p.valid = p.labels != o.ignore_index;
    if ((p.valid & ((p.labels < 0) | (p.labels >= p.vocab))).any().item<bool>())
      throw InputError(where + "label id outside the vocabulary [0, " + std::to_string(p.vocab) + ")");
  } else {
    p.valid = at::ones({p.n}, p.h.options().dtype(at::kBool));
  }
  return p;
}

}  // namespace distill_detail

namespace {

using at::Tensor;
using distill_detail::Mode;
using distill_detail::Prepared;
using distill_detail::prepare;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Running log-sum-exp per row, folded one chunk at a time: m = running max (the chunk's dtype),
// s = Σ exp(x − m) summed in fp64. Per-row results are fp64: the KL is a small difference of
// O(log V) terms (L_τ ≈ 12 at V = 151936), which fp32 row arithmetic would blur at ~1e-6 relative.
struct OnlineLse {
  Tensor m, s;
  OnlineLse(int64_t n, const at::TensorOptions& opt)
      : m(at::full({n}, -std::numeric_limits<double>::infinity(), opt)), s(at::zeros({n}, opt.dtype(at::kDouble))) {}
  // Returns exp(x − new max) for callers that need the weights (the teacher's weighted sum), and the
  // factor by which earlier sums must be rescaled.
  std::pair<Tensor, Tensor> update(const Tensor& x) {
    const Tensor m_new = at::maximum(m, std::get<0>(x.max(1)));
    // A row whose values so far are all −inf keeps m = −inf; shifting by 0 then keeps exp() at 0
    // instead of exp(−inf − −inf) = NaN.
    const Tensor shift = at::where(at::isinf(m_new), at::zeros_like(m_new), m_new);
    const Tensor rescale = at::exp((m - shift).to(at::kDouble));
    Tensor e = at::exp(x - shift.unsqueeze(1));
    s = s * rescale + at::sum(e, {1}, false, at::kDouble);
    m = m_new;
    return {std::move(e), rescale};
  }
  Tensor value() const { return m.to(at::kDouble) + at::log(s); }
};

// Positions of the top-k ids inside chunk [c0, c0 + c): `inside` [N, k] bool, and `pos` [N, k]
// clamped into [0, c) so that gathers and scatter-adds stay in range (callers zero what is outside).
struct ChunkIds {
  Tensor inside, pos;
  ChunkIds(const Tensor& idx, int64_t c0, int64_t c) {
    const Tensor local = idx - c0;
    inside = (local >= 0) & (local < c);
    pos = local.clamp(0, c - 1);
  }
  // Scatters per-id values into a [N, c] tensor (0 elsewhere). Adds, rather than writes, so that
  // the outside ids clamped onto the same column add exact zeros in any order: deterministic.
  Tensor scatter(const Tensor& vals, int64_t c) const {
    return at::zeros({vals.size(0), c}, vals.options()).scatter_add_(1, pos, at::where(inside, vals, at::zeros_like(vals)));
  }
  Tensor mask(int64_t c, const at::TensorOptions& opt) const {
    return scatter(inside.to(opt.dtype()), c).gt(0);
  }
};

// Chunk logits in the compute dtype.
Tensor chunk_logits(const Tensor& h, const Tensor& w, int64_t c0, int64_t c, at::ScalarType acc) {
  return at::matmul(h, w.narrow(0, c0, c).t()).to(acc);
}

// Teacher logits of chunk [c0, c0 + c) in the compute dtype: read from the full [N, V] tensor, or
// made from the teacher's hidden states and head (then nothing [N, V] exists on this side).
Tensor teacher_chunk(const Tensor& t_logits, const Tensor& t_hidden, const Tensor& t_head, int64_t c0, int64_t c,
                     at::ScalarType acc) {
  if (t_logits.defined()) return t_logits.narrow(1, c0, c).to(acc);
  return chunk_logits(t_hidden, t_head, c0, c, acc);
}

struct ChunkedDistillFn : public torch::autograd::Function<ChunkedDistillFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& h, const Tensor& w, const Prepared* pp,
                               const DistillLossOptions& o) {
    const Prepared& p = *pp;
    const auto fopt = h.options().dtype(p.acc);
    const double tau = o.temperature;
    const bool has_kl = p.mode != Mode::kNone;
    const bool has_ce = p.labels.defined();
    const bool bucket = p.mode == Mode::kTopk && o.tail == TopkTail::kBucket;
    const int64_t n = p.n, V = p.vocab, C = std::min(o.vocab_chunk, V);
    const int64_t k = p.mode == Mode::kTopk ? p.t_values.size(1) : 0;

    OnlineLse s_tau(n, fopt), s_one(n, fopt), t_tau(n, fopt), tail(n, fopt);
    Tensor t_wsum = at::zeros({n}, fopt.dtype(at::kDouble));  // full: Σ exp(t/τ − m_t)·(t − z)/τ
    Tensor zk = at::zeros({n, k}, fopt);    // top-k: z/τ at the teacher's ids
    Tensor zy = at::zeros({n}, fopt);       // CE: z at the label
    for (int64_t c0 = 0; c0 < V; c0 += C) {
      const int64_t c = std::min(C, V - c0);
      const Tensor z = chunk_logits(h, w, c0, c, p.acc);
      // At τ = 1 the CE normalizer is the KL one: fold it once (s_one is then filled from s_tau).
      const bool shared = has_kl && tau == 1.0;
      if (has_ce) {
        if (!shared) s_one.update(z);
        const Tensor local = p.labels - c0;
        const Tensor inside = (local >= 0) & (local < c);
        const Tensor g = z.gather(1, local.clamp(0, c - 1).unsqueeze(1)).squeeze(1);
        zy = at::where(inside, g, zy);
      }
      if (!has_kl) continue;
      const Tensor xs = tau == 1.0 ? z : z / tau;
      s_tau.update(xs);
      if (p.mode == Mode::kFull) {
        Tensor tc = teacher_chunk(p.t_logits, p.t_hidden, p.t_head, c0, c, p.acc);
        if (tau != 1.0) tc = tc / tau;
        auto [e, rescale] = t_tau.update(tc);
        // Teacher logits must be finite (a −inf logit would make 0·inf here).
        const Tensor contrib = at::sum((tc - xs).mul_(e), {1}, false, at::kDouble);
        t_wsum = t_wsum * rescale + contrib;
      } else {
        const ChunkIds ids(p.t_idx, c0, c);
        zk = at::where(ids.inside, xs.gather(1, ids.pos), zk);
        if (bucket) tail.update(xs.masked_fill(ids.mask(c, fopt), -std::numeric_limits<double>::infinity()));
      }
    }

    // Row statistics and means in fp64 (see OnlineLse); what backward reads is kept in p.acc.
    const auto dopt = fopt.dtype(at::kDouble);
    const Tensor scale = p.valid.to(at::kDouble) / p.valid.sum().clamp_min(1).to(at::kDouble);  // 1/n on counted rows
    Tensor kl = at::zeros({}, dopt), ce = at::zeros({}, dopt);
    Tensor lse_tau, lse_one, t_lse, tail_factor, topk_target;
    if (has_kl) {
      const Tensor L = s_tau.value();
      const Tensor zkd = zk.to(at::kDouble);
      Tensor kl_tok;
      if (p.mode == Mode::kFull) {
        const Tensor T = t_tau.value();
        kl_tok = t_wsum / t_tau.s - T + L;
        t_lse = T.to(p.acc);
      } else if (!bucket) {
        const Tensor logq = at::log_softmax(p.t_values.to(at::kDouble), 1);
        const Tensor q = at::exp(logq);
        kl_tok = at::where(q > 0, q * (logq - zkd), at::zeros_like(q)).sum(1) + L;
        topk_target = q.to(p.acc);
      } else {
        const Tensor v = p.t_values.to(at::kDouble);
        const Tensor pk = at::exp(v);
        const Tensor r = (1 - pk.sum(1)).clamp(0, 1);
        const Tensor log_u = tail.value() - L;  // student tail mass u, as a log
        // Off the top k, dKL/dz_i = s^τ_i (1 − r/u)/τ, and 1 − r/u = (P_K − S_K)/u with P_K, S_K the
        // teacher's and student's top-k masses: this form keeps the small difference P_K − S_K
        // where r ≈ u, instead of subtracting two nearly equal per-element terms in fp32. A row with
        // no student tail (k = V) has no off-K columns: factor 0.
        const Tensor sk = at::exp(zkd - L.unsqueeze(1)).sum(1);
        tail_factor = at::where(at::isinf(log_u), at::zeros_like(r), (pk.sum(1) - sk) * at::exp(-log_u)).to(p.acc);
        const Tensor head = at::where(pk > 0, pk * (v - zkd + L.unsqueeze(1)), at::zeros_like(pk)).sum(1);
        const Tensor tail_term = at::where(r > 0, r * (at::log(r) - log_u), at::zeros_like(r));
        kl_tok = head + tail_term;
        topk_target = pk.to(p.acc);
      }
      kl = (at::where(p.valid, kl_tok, at::zeros_like(kl_tok)) * scale).sum();
      lse_tau = L.to(p.acc);
    }
    if (has_ce) {
      const Tensor L1 = has_kl && tau == 1.0 ? s_tau.value() : s_one.value();
      const Tensor ce_tok = L1 - zy.to(at::kDouble);
      ce = (at::where(p.valid, ce_tok, at::zeros_like(ce_tok)) * scale).sum();
      lse_one = L1.to(p.acc);
    }
    kl = kl.to(p.acc);
    ce = ce.to(p.acc);
    Tensor loss = at::zeros({}, fopt);
    if (o.alpha > 0) loss = loss + o.alpha * tau * tau * kl;
    if (o.alpha < 1) loss = loss + (1 - o.alpha) * ce;
    Tensor tokens = p.valid.sum();

    ctx->save_for_backward({h, w});
    auto& sd = ctx->saved_data;
    sd["alpha"] = o.alpha;
    sd["tau"] = tau;
    sd["chunk"] = C;
    sd["mode"] = static_cast<int64_t>(p.mode);
    sd["bucket"] = bucket;
    sd["scale"] = scale.to(p.acc);
    auto keep = [&](const char* key, const Tensor& t) {
      if (t.defined()) sd[key] = t;
    };
    keep("lse_tau", lse_tau);
    keep("lse_one", lse_one);
    keep("t_logits", p.t_logits);
    keep("t_hidden", p.t_hidden);
    keep("t_head", p.t_head);
    keep("t_lse", t_lse);
    keep("t_idx", p.t_idx);
    keep("topk_target", topk_target);
    keep("tail_factor", tail_factor);
    keep("labels", p.labels);
    ctx->mark_non_differentiable({kl, ce, tokens});
    return {loss, kl, ce, tokens};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& h = saved[0];
    const Tensor& w = saved[1];
    auto& sd = ctx->saved_data;
    auto get = [&](const char* key) { return sd.count(key) ? sd.at(key).toTensor() : Tensor(); };
    const double alpha = sd.at("alpha").toDouble();
    const double tau = sd.at("tau").toDouble();
    const int64_t C = sd.at("chunk").toInt();
    const Mode mode = static_cast<Mode>(sd.at("mode").toInt());
    const bool bucket = sd.at("bucket").toBool();
    const Tensor lse_tau = get("lse_tau"), lse_one = get("lse_one"), t_logits = get("t_logits"), t_lse = get("t_lse"),
                 t_hidden = get("t_hidden"), t_head = get("t_head"),
                 t_idx = get("t_idx"), topk_target = get("topk_target"), tail_factor = get("tail_factor"),
                 labels = get("labels");
    const Tensor scale = get("scale");
    const at::ScalarType acc = scale.scalar_type();
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    if (!need_h && !need_w) return {Tensor(), Tensor(), Tensor(), Tensor()};

    const bool kl_part = alpha > 0 && mode != Mode::kNone;
    const bool ce_part = alpha < 1 && labels.defined();
    const int64_t n = h.size(0), V = w.size(0);
    // d loss / d z for row r is scaled by 1/n_counted and by the incoming gradient of `loss`.
    const Tensor row_scale = (scale * grads[0].to(acc)).unsqueeze(1);
    Tensor grad_h = need_h ? at::zeros({n, h.size(1)}, h.options().dtype(acc)) : Tensor();
    Tensor grad_w = need_w ? at::empty_like(w, at::MemoryFormat::Contiguous) : Tensor();
    for (int64_t c0 = 0; c0 < V; c0 += C) {
      const int64_t c = std::min(C, V - c0);
      const Tensor z = chunk_logits(h, w, c0, c, acc);
      Tensor dz;
      // At τ = 1 softmax(z/τ) is softmax(z): one exp serves both terms,
      // dz = s − α·target − (1−α)·onehot(y)  (the bucket tail keeps the general path).
      const bool share = kl_part && ce_part && tau == 1.0 && !bucket;
      if (kl_part) {
        const Tensor xs = tau == 1.0 ? z : z / tau;
        Tensor s = (xs - lse_tau.unsqueeze(1)).exp_();  // s^τ
        const double w_kl = share ? alpha : 1.0;        // share: s − α·target; else (s − target)·ατ below
        if (mode == Mode::kFull) {
          const Tensor tc = teacher_chunk(t_logits, t_hidden, t_head, c0, c, acc);
          dz = s.sub_((tau == 1.0 ? tc - t_lse.unsqueeze(1) : tc / tau - t_lse.unsqueeze(1)).exp_(), w_kl);
        } else if (!bucket) {
          const ChunkIds ids(t_idx, c0, c);
          dz = s.sub_(ids.scatter(topk_target, c), w_kl);
        } else {
          // s·f everywhere, then on the top-k columns add s_K(1 − f) − p_K, which leaves s_K − p_K.
          const ChunkIds ids(t_idx, c0, c);
          const Tensor f = tail_factor.unsqueeze(1);
          const Tensor fix = s.gather(1, ids.pos) * (1 - f) - topk_target;
          dz = s.mul_(f).scatter_add_(1, ids.pos, at::where(ids.inside, fix, at::zeros_like(fix)));
        }
        if (!share) dz.mul_(alpha * tau);
      }
      if (ce_part) {
        const Tensor local = labels - c0;
        const Tensor inside = ((local >= 0) & (local < c)).unsqueeze(1);
        const Tensor pos = local.clamp(0, c - 1).unsqueeze(1);
        // − onehot(y): −1 at the label's column for rows whose label falls in this chunk, +0 elsewhere.
        if (share) {
          dz.scatter_add_(1, pos, inside.to(acc).mul_(alpha - 1));
        } else {
          Tensor sm = (z - lse_one.unsqueeze(1)).exp_();
          sm.scatter_add_(1, pos, inside.to(acc).neg_());
          dz = dz.defined() ? dz.add_(sm, 1 - alpha) : sm.mul_(1 - alpha);
        }
      }
      if (!dz.defined()) dz = at::zeros({n, c}, z.options());
      dz.mul_(row_scale);
      if (need_h) grad_h.add_(at::matmul(dz.to(w.scalar_type()), w.narrow(0, c0, c)).to(acc));
      if (need_w) {
        Tensor gw = grad_w.narrow(0, c0, c);
        if (h.scalar_type() == w.scalar_type() && w.scalar_type() == dz.scalar_type())
          at::mm_out(gw, dz.t(), h);
        else
          gw.copy_(at::matmul(dz.t().to(h.scalar_type()), h));
      }
    }
    return {need_h ? grad_h.to(h.scalar_type()) : Tensor(), grad_w, Tensor(), Tensor()};
  }
};

}  // namespace

DistillLossOptions distill_loss_options(const DistillConfig& cfg) {
  DistillLossOptions o;
  o.alpha = cfg.alpha;
  o.temperature = cfg.temperature;
  o.vocab_chunk = cfg.vocab_chunk;
  o.row_chunk = cfg.row_chunk;
  if (cfg.tail == "renormalize") {
    o.tail = TopkTail::kRenormalize;
  } else if (cfg.tail == "bucket") {
    o.tail = TopkTail::kBucket;
  } else {
    throw InputError("distill.tail: expected \"renormalize\" or \"bucket\", got \"" + cfg.tail + "\"");
  }
  return o;
}

DistillLoss distill_loss(const Tensor& hidden, const Tensor& head_weight, const TeacherTargets& teacher,
                         const Tensor& labels, const DistillLossOptions& options, DistillLossWorkspace* workspace) {
  Prepared p = prepare(hidden, head_weight, teacher, labels, options);
  if (options.chunking == LossChunking::kRows) {
    const bool grad = at::GradMode::is_enabled();
    return distill_detail::row_chunked_loss(p, options, grad && p.h.requires_grad(), grad && p.w.requires_grad(),
                                            workspace);
  }
  // The vocabulary-chunked form multiplies in hidden's dtype throughout: a master head goes
  // through autograd's cast, as GrowableStudent::head_weight() makes it.
  if (p.w.scalar_type() != p.h.scalar_type()) p.w = p.w.to(p.h.scalar_type());
  variable_list out = ChunkedDistillFn::apply(p.h, p.w, &p, options);
  return {out[0], out[1], out[2], out[3]};
}

DistillLoss distill_loss_reference(const Tensor& hidden, const Tensor& head_weight, const TeacherTargets& teacher,
                                   const Tensor& labels, const DistillLossOptions& o) {
  const Prepared p = prepare(hidden, head_weight, teacher, labels, o);
  const double tau = o.temperature;
  const Tensor w = p.w.scalar_type() == p.h.scalar_type() ? p.w : p.w.to(p.h.scalar_type());  // a master head's cast
  const Tensor z = at::matmul(p.h, w.t()).to(p.acc);
  const Tensor scale = p.valid.to(p.acc) / p.valid.sum().clamp_min(1).to(p.acc);
  Tensor kl = at::zeros({}, z.options()), ce = at::zeros({}, z.options());
  if (p.mode != Mode::kNone) {
    const Tensor log_s = at::log_softmax(z / tau, 1);
    Tensor kl_tok;
    if (p.mode == Mode::kFull) {
      const Tensor t = p.t_logits.defined() ? p.t_logits : at::matmul(p.t_hidden, p.t_head.t());
      const Tensor log_p = at::log_softmax(t.to(p.acc) / tau, 1);
      kl_tok = (at::exp(log_p) * (log_p - log_s)).sum(1);
    } else if (o.tail == TopkTail::kRenormalize) {
      const Tensor logq = at::log_softmax(p.t_values, 1);
      kl_tok = (at::exp(logq) * (logq - log_s.gather(1, p.t_idx))).sum(1);
    } else {
      const Tensor pk = at::exp(p.t_values);
      const Tensor r = (1 - pk.sum(1)).clamp(0, 1);
      const Tensor log_u = log_s.scatter(1, p.t_idx, -std::numeric_limits<double>::infinity()).logsumexp(1);
      kl_tok = (pk * (p.t_values - log_s.gather(1, p.t_idx))).sum(1) +
               at::where(r > 0, r * (at::log(r.clamp_min(1e-300)) - log_u), at::zeros_like(r));
    }
    kl = (at::where(p.valid, kl_tok, at::zeros_like(kl_tok)) * scale).sum();
  }
  if (p.labels.defined()) {
    const Tensor nll = -at::log_softmax(z, 1).gather(1, p.labels.clamp_min(0).unsqueeze(1)).squeeze(1);
    ce = (at::where(p.valid, nll, at::zeros_like(nll)) * scale).sum();
  }
  Tensor loss = at::zeros({}, z.options());
  if (o.alpha > 0) loss = loss + o.alpha * tau * tau * kl;
  if (o.alpha < 1) loss = loss + (1 - o.alpha) * ce;
  return {loss, kl.detach(), ce.detach(), p.valid.sum()};
}

TeacherTargets teacher_topk(const Tensor& logits, int64_t k, double temperature, int64_t vocab_chunk) {
  if (!logits.defined() || logits.dim() < 1) throw InputError("teacher_topk: logits are missing");
  const int64_t V = logits.size(-1);
  if (k < 1 || k > V) throw InputError("teacher_topk: k = " + std::to_string(k) + " outside [1, " + std::to_string(V) + "]");
  if (!(temperature > 0)) throw InputError("teacher_topk: temperature must be > 0");
  at::NoGradGuard no_grad;
  const Tensor t = logits.reshape({-1, V});
  const auto acc = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t C = std::max<int64_t>(1, std::min(vocab_chunk, V));
  OnlineLse lse(t.size(0), t.options().dtype(acc));
  for (int64_t c0 = 0; c0 < V; c0 += C) {
    const int64_t c = std::min(C, V - c0);
    lse.update(t.narrow(1, c0, c).to(acc) / temperature);
  }
  auto [vals, idx] = at::topk(t, k, 1);
  return TeacherTargets::topk(vals.to(acc) / temperature - lse.value().unsqueeze(1), idx);
}

}  // namespace deepen
