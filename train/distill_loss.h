// Distillation loss α·τ²·KL(p_T^τ‖p_S^τ) + (1−α)·CE over row chunks, its gradients made in the forward.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "config/config.h"
#include "model/cpu_kernel_choice.h"

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
//        teacher logits are t = g·Uᵀ, made chunk by chunk (t_c = g_c·Uᵀ, once) exactly where the
//        full form reads its chunk of t; from there on it IS the full form, so the KL stays exact
//        over the whole vocabulary while no [N, V] teacher tensor exists. The only difference to
//        sending t: each chunk's matmul sums the same Ht products, possibly in another order (BLAS
//        blocking), see the test's tolerance.
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
// sampled: the teacher's distribution estimated from K draws of it (Random Sampling KD, Anshumann et
//        al., arXiv 2503.16870; what a teacher cache stores, teacher_cache/): ids id_j with weights
//        w_j = c_j / K (c_j: how often id_j came up among K draws from p = p_T^τ, so Σ_j w_j = 1) and
//        the teacher's entropy H = −Σ_i p_i log p_i. With p̂_i = Σ_{j: id_j = i} w_j, E[p̂_i] = p_i
//        (each draw lands on i with probability p_i), and the loss takes
//          KL̂ = Σ_j w_j (L_τ − z_{id_j}/τ) − H   (= CE(p̂, s^τ) − H(p): linear in p̂, so
//          E[KL̂] = CE(p, s^τ) − H(p) = KL(p ‖ s^τ): unbiased, the value and its gradient)
//        dKL̂/dz_i = (s^τ_i·Σ_j w_j − p̂_i)/τ,  E[dKL̂/dz_i] = (s^τ_i − p_i)/τ, the full form's.
//        Not KL(p̂ ‖ s^τ): its entropy term −H(p̂) is biased (low); it would not change the gradient,
//        only the value. Ids need not be distinct (their weights add); a weight of 0 counts for nothing.
//        Unlike top-k, nothing is renormalised: the sampled ids carry the teacher's mass in
//        expectation wherever it lies, the tail included.
// CE:    dCE/dz_i = s_i − [i = y].
// So dloss/dz_i = (α·τ·(s^τ_i − target_i) + (1−α)·(s_i − [i = y])) / n_counted, and
// dloss/dh = Σ_chunks dz_c · W_c,  dloss/dW_c = dz_cᵀ · h.
//
// ---- How it is computed --------------------------------------------------------------------------
// Rows in chunks, each with the whole vocabulary (row_chunked_loss.cpp): a chunk's logits
// z_c = h_c·Wᵀ [R, V] are made once, so each row's log-sum-exps are exact inside the chunk; the
// row's KL, CE and dz are formed from them (train/distill_rows.h: one fused pass per row on CPU in
// fp32; ATen ops elsewhere) and dz goes straight into the two gradient matmuls: grad_h_c = dz·W and
// grad_W += dzᵀ·h_c (fp32 accumulation over the chunks, as autograd's one matmul would over the
// rows). Both gradients are made in the FORWARD and the backward only hands them on, scaled by the
// incoming gradient: no logit is made twice, and with hidden-state targets the teacher's logits
// (t_c = g_c·Uᵀ) are made once too. Gradients are only made for inputs that need them (grad mode on
// and requires_grad): a frozen head (freeze control) costs no dzᵀ·h matmul, evaluation none at all.
// The head weight's gradient goes to autograd like any other (AccumulateGrad adds it to .grad over
// micro-batches; a tied embedding's two uses are summed), in the weight's own dtype.
// Memory: R × V elements of chunk buffers (4 bytes: the fp32 logits/dz; + 4 for a teacher chunk
// that must be made or widened: hidden-state targets, bf16 logits; + 2 for the bf16 GEMM output
// when the student computes in bf16), R from row_chunk or, by default, from a memory budget
// (train/loss_chunking.h); plus the two gradients [N, H] and [V, H]. Neither the student's nor
// the teacher's [N, V] logits exist. A DistillLossWorkspace keeps those buffers from call to call.
// Precision: bf16 hidden states (and head) are multiplied in bf16 and the products used in fp32, as
// autocast would; dz stays fp32 for the head's gradient on CPU (fp32 GEMM on the bf16 values) and is
// rounded to bf16 for the bf16 GEMMs elsewhere. Compute dtype: fp32 (fp64 when hidden is fp64).
// A bf16 student may pass its fp32 master head (bf16-mixed): the loss casts it for the matmuls and
// returns the fp32 gradient to the master directly, with no bf16 rounding of the gradient.
//
// Why rows and not vocabulary chunks: the former loss folded vocabulary chunks into online
// log-sum-exps (as in flash attention), so it could only form dz in a second pass that made every
// chunk's logits (and a hidden-state teacher's) again, with ~10 [N, chunk] fp32 temporaries. Measured
// against it (kd_step_bench, loss_memory_bench) it was slower everywhere, 2.1-3.8x for the loss
// alone, and its smaller memory at small micro-batches is the row form's with a smaller row_chunk.

// (TopkTail, distill.tail: config/options.h)
struct DistillLossOptions {
  double alpha = 1.0;                     // weight of the KL term; 1 − α weighs CE on the labels
  double temperature = 1.0;               // τ
  int64_t row_chunk = 0;                  // rows per chunk (need not divide N); 0 = from the memory budget (loss_chunking.h)
  TopkTail tail = TopkTail::kRenormalize; // top-k targets only
  int64_t ignore_index = -100;            // labels equal to it count for neither KL nor CE
  // On CPU: the fused row kernel (auto, fused) or ATen ops (aten: what other devices run).
  CpuKernels kernels = CpuKernels::kAuto;
};

// Buffers the row-chunked loss reuses from call to call: its chunk buffers, the compute-dtype copy
// of an fp32 master head, and the storage of a head gradient autograd has let go of. On a machine
// where the first touch of a page costs ~11 µs per 4 KiB (the 2-core VM this was measured on), a
// fresh [R, V] or [V, H] buffer costs more than the arithmetic done in it. A trainer owns one and
// passes it to every call; calls must not overlap. Not copyable (it owns memory).
class DistillLossWorkspace {
 public:
  DistillLossWorkspace() = default;
  DistillLossWorkspace(const DistillLossWorkspace&) = delete;
  DistillLossWorkspace& operator=(const DistillLossWorkspace&) = delete;

  // A contiguous [rows, cols] tensor of `options` over buffer `slot`; the buffer grows when too
  // small and is otherwise reused (its contents are whatever the last user left).
  at::Tensor buffer(size_t slot, int64_t rows, int64_t cols, const at::TensorOptions& options);
  // An uninitialized tensor like `like` (contiguous) for a gradient that is handed to autograd:
  // built on the storage of an earlier one when nothing else holds that storage any more (autograd
  // dropped it: the optimizer's zero_grad, or a micro-batch's gradient added into .grad), else new.
  at::Tensor gradient(const at::Tensor& like);
  // Bytes held now (buffers and kept gradient storages), for benchmarks and the memory model's check.
  int64_t bytes() const;

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<at::Storage> gradients_;
};

// distill.alpha, temperature, row_chunk and tail.
DistillLossOptions distill_loss_options(const DistillConfig& cfg);

// What the teacher sends for a micro-batch; leading dims flatten to N rows like `hidden`'s.
struct TeacherTargets {
  at::Tensor logits;   // full: [N, V] raw logits, fp32 or bf16 (τ applied inside the loss)
  at::Tensor values;   // top-k: [N, k] log p_T^τ at the ids (fp32 or bf16), see teacher_topk
  at::Tensor indices;  // top-k: [N, k] int64 or int32, distinct within a row
  at::Tensor hidden;   // hidden: [N, Ht] the teacher's final normalised hidden states (fp32 or bf16)
  at::Tensor head;     // hidden: [V, Ht] the teacher's frozen LM head (lm_head, or its tied embedding)
  at::Tensor sample_ids;      // sampled: [N, M] int64 or int32 ids drawn from p_T^τ (M per row, padded with weight 0)
  at::Tensor sample_weights;  // sampled: [N, M] fp32 (or fp64) weights c_j / K, >= 0
  at::Tensor entropy;         // sampled: [N] the teacher's entropy H(p_T^τ) in nats (the KL's constant term)

  static TeacherTargets none() { return {}; }
  static TeacherTargets full(at::Tensor logits) { return {std::move(logits), {}, {}}; }
  static TeacherTargets topk(at::Tensor values, at::Tensor indices) { return {{}, std::move(values), std::move(indices)}; }
  static TeacherTargets from_hidden(at::Tensor hidden, at::Tensor head) {
    return {{}, {}, {}, std::move(hidden), std::move(head)};
  }
  static TeacherTargets sampled(at::Tensor ids, at::Tensor weights, at::Tensor entropy) {
    TeacherTargets t;
    t.sample_ids = std::move(ids);
    t.sample_weights = std::move(weights);
    t.entropy = std::move(entropy);
    return t;
  }
  bool is_full() const { return logits.defined(); }
  bool is_topk() const { return values.defined(); }
  bool is_hidden() const { return hidden.defined(); }
  bool is_sampled() const { return sample_ids.defined(); }
  bool empty() const { return !is_full() && !is_topk() && !is_hidden() && !is_sampled(); }
};

struct DistillLoss {
  at::Tensor loss;    // scalar, differentiable w.r.t. hidden and head_weight
  at::Tensor kl;      // scalar, detached: mean KL(p_T^τ ‖ p_S^τ) without the τ² factor (0 without teacher)
  at::Tensor ce;      // scalar, detached: mean CE on the labels (0 without labels)
  at::Tensor tokens;  // scalar int64, detached: counted tokens (the denominator of both means)
};

// The chunked loss (see above). hidden: [..., H] final hidden states (after the final norm, if any);
// head_weight: [V, H] (the tied embedding or the LM head), in hidden's dtype or, for a bf16 student,
// its fp32 master; labels: [...] int64 next-token ids, or
// undefined (then α must be 1). Teacher: none (then α must be 0: the CE-only pretraining loss),
// full, top-k, hidden or sampled. Eval: call it under at::NoGradGuard with τ = 1 to get KL(teacher‖student) and CE.
// `workspace`: buffers kept between calls (nullptr: this call's own).
// Throws InputError on mismatched shapes, ids outside [0, V), or a missing teacher/labels for α.
DistillLoss distill_loss(const at::Tensor& hidden, const at::Tensor& head_weight, const TeacherTargets& teacher,
                         const at::Tensor& labels, const DistillLossOptions& options,
                         DistillLossWorkspace* workspace = nullptr);

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
