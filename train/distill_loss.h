// Distillation loss α·τ²·KL(p_T^τ‖p_S^τ) + (1−α)·CE, computed in vocabulary chunks with a custom backward.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "config/config.h"

namespace deepen {

// ---- The math ------------------------------------------------------------------------------------
// Per token (row) n, student logits z = h·Wᵀ (h: final hidden state [H], W: head weight [V, H]),
// student distributions s^τ = softmax(z/τ) and s = softmax(z), L_τ = logsumexp(z/τ), L_1 = logsumexp(z).
//
//   loss = α · τ² · mean_n KL_n + (1 − α) · mean_n CE_n,   CE_n = L_1 − z_y   (y = label)
//
// means over the counted tokens: those whose label is not ignore_index (all tokens when no labels
// are given). Teacher targets come in three forms:
//
// full:  teacher logits t [N, V] (fp32 or bf16). p = softmax(t/τ), T_τ = logsumexp(t/τ),
//        KL = Σ_i p_i (log p_i − log s^τ_i) = Σ_i p_i (t_i − z_i)/τ − T_τ + L_τ.
//        dKL/dz_i = (s^τ_i − p_i)/τ.
// hidden: the teacher's final normalised hidden states g [N, Ht] and its LM head U [V, Ht]: the
//        teacher logits are t = g·Uᵀ, made chunk by chunk (t_c = g·U_cᵀ) exactly where the full
//        form reads its chunk of t, in the forward and again in the backward; from there on it IS
//        the full form, so the KL stays exact over the whole vocabulary while no [N, V] teacher
//        tensor exists. The only difference to sending t: each chunk's matmul sums the same Ht
//        products, possibly in another order (BLAS blocking), see the test's tolerance.
// top-k: K = the teacher's k ids per token (distinct), v_j = log p_T^τ at id_j: the teacher's
//        log-probabilities at temperature τ over the FULL vocabulary (teacher_topk makes them;
//        values are used as given, τ is not applied to them again).
//   "renormalize": the teacher is taken as q_j = exp(v_j) / Σ_K exp(v) on K and 0 elsewhere, and
//        KL(q ‖ s^τ) = Σ_j q_j (log q_j − z_{id_j}/τ + L_τ)   (the student keeps its full softmax, so
//        mass it puts outside K is penalized through L_τ).  dKL/dz_i = (s^τ_i − q_i)/τ, q_i = 0 off K.
//   "bucket": the teacher is p_j = exp(v_j) on K plus one tail bucket r = 1 − Σ_K p (clamped to
//        [0, 1]); the student likewise s^τ_{id_j} on K plus its tail u = Σ_{i∉K} s^τ_i, computed as
//        log u = logsumexp_{i∉K}(z_i/τ) − L_τ (no 1 − Σ cancellation):
//        KL = Σ_j p_j (v_j − log s^τ_{id_j}) + r (log r − log u),   0·log 0 = 0.
//        dKL/dz_i = (s^τ_i − p_i)/τ on K, and (s^τ_i − r·s^τ_i/u)/τ off K: the teacher's tail mass
//        is spread over the non-top-k ids in proportion to the student's own tail.
// CE:    dCE/dz_i = s_i − [i = y].
// So dloss/dz_i = (α·τ·(s^τ_i − target_i) + (1−α)·(s_i − [i = y])) / n_counted, and
// dloss/dh = Σ_chunks dz_c · W_c,  dloss/dW_c = dz_cᵀ · h.
//
// ---- Memory --------------------------------------------------------------------------------------
// Forward: one pass over vocabulary chunks of `vocab_chunk` columns; each chunk's logits [N, C] are
// made, folded into running per-row log-sum-exps (online, as in flash attention) and dropped. Only
// per-row statistics ([N] each) are kept. Backward: a second pass recomputes each chunk's logits and
// writes dz_c straight into the two gradient matmuls. Neither the student's nor the teacher's
// [N, V] fp32 probabilities ever exist; the largest temporaries are a few [N, C] tensors (plus
// the [V, H] weight gradient, which the optimizer needs anyway). Compute dtype: fp32 (fp64 when
// `hidden` is fp64); bf16 hidden/weight are multiplied in bf16 and the results used in fp32.

// (TopkTail, distill.tail: config/options.h)
struct DistillLossOptions {
  double alpha = 1.0;                     // weight of the KL term; 1 − α weighs CE on the labels
  double temperature = 1.0;               // τ
  int64_t vocab_chunk = 8192;             // vocabulary columns per chunk (need not divide V)
  TopkTail tail = TopkTail::kRenormalize; // top-k targets only
  int64_t ignore_index = -100;            // labels equal to it count for neither KL nor CE
};

// distill.alpha, temperature, vocab_chunk and tail.
DistillLossOptions distill_loss_options(const DistillConfig& cfg);

// What the teacher sends for a micro-batch; leading dims flatten to N rows like `hidden`'s.
struct TeacherTargets {
  at::Tensor logits;   // full: [N, V] raw logits, fp32 or bf16 (τ applied inside the loss)
  at::Tensor values;   // top-k: [N, k] log p_T^τ at the ids (fp32 or bf16), see teacher_topk
  at::Tensor indices;  // top-k: [N, k] int64 or int32, distinct within a row
  at::Tensor hidden;   // hidden: [N, Ht] the teacher's final normalised hidden states (fp32 or bf16)
  at::Tensor head;     // hidden: [V, Ht] the teacher's frozen LM head (lm_head, or its tied embedding)

  static TeacherTargets none() { return {}; }
  static TeacherTargets full(at::Tensor logits) { return {std::move(logits), {}, {}}; }
  static TeacherTargets topk(at::Tensor values, at::Tensor indices) { return {{}, std::move(values), std::move(indices)}; }
  static TeacherTargets from_hidden(at::Tensor hidden, at::Tensor head) {
    return {{}, {}, {}, std::move(hidden), std::move(head)};
  }
  bool is_full() const { return logits.defined(); }
  bool is_topk() const { return values.defined(); }
  bool is_hidden() const { return hidden.defined(); }
  bool empty() const { return !is_full() && !is_topk() && !is_hidden(); }
};

struct DistillLoss {
  at::Tensor loss;    // scalar, differentiable w.r.t. hidden and head_weight
  at::Tensor kl;      // scalar, detached: mean KL(p_T^τ ‖ p_S^τ) without the τ² factor (0 without teacher)
  at::Tensor ce;      // scalar, detached: mean CE on the labels (0 without labels)
  at::Tensor tokens;  // scalar int64, detached: counted tokens (the denominator of both means)
};

// The chunked loss (see above). hidden: [..., H] final hidden states (after the final norm, if any);
// head_weight: [V, H] (the tied embedding or the LM head); labels: [...] int64 next-token ids, or
// undefined (then α must be 1). Teacher: none (then α must be 0: the CE-only pretraining loss),
// full, top-k or hidden. Eval: call it under at::NoGradGuard with τ = 1 to get KL(teacher‖student) and CE.
// Throws InputError on mismatched shapes, ids outside [0, V), or a missing teacher/labels for α.
DistillLoss distill_loss(const at::Tensor& hidden, const at::Tensor& head_weight, const TeacherTargets& teacher,
                         const at::Tensor& labels, const DistillLossOptions& options);

// The same loss with plain autograd, materializing [N, V] logits and log-probabilities: the
// reference the chunked version is tested and benchmarked against. Not for training at full vocab.
DistillLoss distill_loss_reference(const at::Tensor& hidden, const at::Tensor& head_weight,
                                   const TeacherTargets& teacher, const at::Tensor& labels,
                                   const DistillLossOptions& options);

// Teacher side of a top-k channel: the k largest logits per row of `logits` [..., V] and their
// log-probabilities at temperature τ, log softmax(t/τ) (fp32, the log-sum-exp taken in vocabulary
// chunks so no second [N, V] fp32 tensor is made). Returns values [N, k] fp32 and indices [N, k]
// int64 with N = the product of the leading dims.
TeacherTargets teacher_topk(const at::Tensor& logits, int64_t k, double temperature, int64_t vocab_chunk = 8192);

}  // namespace deepen
