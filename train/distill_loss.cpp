// The distillation loss's entry (inputs checked, then row_chunked_loss.cpp), its reference, and top-k targets.
#include "train/distill_loss.h"

#include <ATen/ATen.h>

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
  if (int{teacher.is_full()} + int{teacher.is_topk()} + int{teacher.is_hidden()} + int{teacher.is_sampled()} > 1)
    throw InputError(where + "teacher targets must be one of full, top-k, hidden or sampled");
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
  } else if (teacher.is_sampled()) {
    p.mode = Mode::kSampled;
    const Tensor& idx = teacher.sample_ids;
    const Tensor& w = teacher.sample_weights;
    const Tensor& h = teacher.entropy;
    if (!w.defined() || w.sizes() != idx.sizes() || idx.dim() < 1 || idx.numel() != p.n * idx.size(-1))
      throw InputError(where + "sampled ids " + shape_of(idx) + " and weights " + (w.defined() ? shape_of(w) : "(none)") +
                       " must both be [" + std::to_string(p.n) + ", M]");
    if (idx.scalar_type() != at::kLong && idx.scalar_type() != at::kInt)
      throw InputError(where + "sampled ids must be int64 or int32");
    if (!at::isFloatingType(w.scalar_type())) throw InputError(where + "sample weights must be floating point");
    if (!h.defined() || h.numel() != p.n || !at::isFloatingType(h.scalar_type()))
      throw InputError(where + "sampled targets need the teacher's entropy per token, [" + std::to_string(p.n) + "], got " +
                       (h.defined() ? shape_of(h) : "(none)"));
    const int64_t m = idx.size(-1);
    p.t_idx = idx.reshape({p.n, m}).to(at::kLong).contiguous();
    p.t_weights = w.reshape({p.n, m}).to(p.acc).contiguous();
    p.t_entropy = h.reshape({p.n}).to(at::kDouble).contiguous();
    if (m > 0 && ((p.t_idx < 0) | (p.t_idx >= p.vocab)).any().item<bool>())
      throw InputError(where + "sampled id outside the vocabulary [0, " + std::to_string(p.vocab) + ")");
    if (m > 0 && !((p.t_weights >= 0) & at::isfinite(p.t_weights)).all().item<bool>())
      throw InputError(where + "sample weights must be finite and >= 0");
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

// teacher_topk's running log-sum-exp per row, folded one vocabulary chunk at a time (so no second
// [N, V] fp32 tensor is made): m = running max (the chunk's dtype), s = Σ exp(x − m) summed in fp64.
// Per-row results are fp64: the values are log-probabilities of O(log V) (≈ 12 at V = 151936),
// which fp32 row arithmetic would blur at ~1e-6 relative.
struct OnlineLse {
  Tensor m, s;
  OnlineLse(int64_t n, const at::TensorOptions& opt)
      : m(at::full({n}, -std::numeric_limits<double>::infinity(), opt)), s(at::zeros({n}, opt.dtype(at::kDouble))) {}
  void update(const Tensor& x) {
    const Tensor m_new = at::maximum(m, std::get<0>(x.max(1)));
    // A row whose values so far are all −inf keeps m = −inf; shifting by 0 then keeps exp() at 0
    // instead of exp(−inf − −inf) = NaN.
    const Tensor shift = at::where(at::isinf(m_new), at::zeros_like(m_new), m_new);
    const Tensor rescale = at::exp((m - shift).to(at::kDouble));
    s = s * rescale + at::sum(at::exp(x - shift.unsqueeze(1)), {1}, false, at::kDouble);
    m = m_new;
  }
  Tensor value() const { return m.to(at::kDouble) + at::log(s); }
};

}  // namespace

DistillLossOptions distill_loss_options(const DistillConfig& cfg) {
  DistillLossOptions o;
  o.alpha = cfg.alpha;
  o.temperature = cfg.temperature;
  o.row_chunk = cfg.row_chunk;
  o.tail = cfg.tail;
  return o;
}

DistillLoss distill_loss(const Tensor& hidden, const Tensor& head_weight, const TeacherTargets& teacher,
                         const Tensor& labels, const DistillLossOptions& options, DistillLossWorkspace* workspace) {
  const Prepared p = prepare(hidden, head_weight, teacher, labels, options);
  const bool grad = at::GradMode::is_enabled();
  return distill_detail::row_chunked_loss(p, options, grad && p.h.requires_grad(), grad && p.w.requires_grad(),
                                          workspace);
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
    } else if (p.mode == Mode::kSampled) {
      // −Σ_j w_j log s^τ_{id_j} − H: autograd's gradient is the sampled form's, Σ_j w_j·s^τ − p̂.
      kl_tok = (p.t_weights * -log_s.gather(1, p.t_idx)).sum(1) - p.t_entropy.to(p.acc);
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
