// One row of the distillation loss over the whole vocabulary, fused: the row's KL and CE, and
// d loss / d z written over its logits in the same call. Torch-free fp32 loops (CPU).
#pragma once

#include <cstdint>

namespace deepen::distill_rows {

// The formulas are train/distill_loss.h's, per row, with every log-sum-exp exact over the row (no
// online rescaling: the whole vocabulary is in hand). Arithmetic, as the former vocabulary-chunked
// loss did it and the ATen path (row_chunked_loss.cpp) does: logits, shifts, exps and dz in fp32; every sum over the vocabulary (Σ e^x, the
// teacher's weighted sum) and everything per row (log-sum-exps, KL, CE) in fp64. exp is
// vexp_softmax (model/vector_exp.h, within 2 ulp: DistillRows.ExpIsWithinTwoUlps). Full targets at
// τ = 1 with the gradient make dz from the sums pass's own exps, e^{z−max}·(coefficient/Σ) −
// e^{t−max_t}·(coefficient/Σ_t), in place of e^{z−L} and e^{t−T} at the rounded log-sum-exps: the
// same terms within a rounding each (the row-chunked loss tests' derived bounds hold unchanged).

enum class Target { kNone, kFull, kTopkRenormalize, kTopkBucket, kSampled };

// What is the same for every row of a call.
struct RowTask {
  int64_t vocab = 0;
  double alpha = 1.0;        // KL weight; 1 − α weighs CE
  double temperature = 1.0;  // τ
  Target target = Target::kNone;
  bool ce = false;           // labels given: CE is computed (and weighs 1 − α in dz)
  bool gradient = false;     // write dz over the row's logits
};

struct Row {
  float* z = nullptr;                // [vocab] student logits; dz on return when task.gradient
  const float* teacher = nullptr;    // full: [vocab] teacher logits (finite)
  const float* topk_values = nullptr;  // top-k: [k] log p_T^τ (see teacher_topk)
  const int64_t* topk_ids = nullptr;   // top-k: [k] distinct ids in [0, vocab)
  int64_t k = 0;
  const int64_t* sample_ids = nullptr;     // sampled: [k] ids in [0, vocab) (repeats allowed)
  const float* sample_weights = nullptr;   // sampled: [k] weights c_j / K (>= 0)
  double entropy = 0;                      // sampled: the teacher's entropy H(p_T^τ)
  int64_t label = 0;                 // task.ce: the next-token id, in [0, vocab)
  double scale = 0;                  // dz = scale · d(α·τ²·KL + (1 − α)·CE)/dz (1 / counted rows)
};

struct RowResult {
  double kl = 0;  // KL(p_T^τ ‖ p_S^τ) of the row, without τ² (0 without a target)
  double ce = 0;  // L_1 − z_y (0 without a label)
};

// e^x for x <= 0 as the kernel computes it (vexp_softmax in this file's SIMD clones), over n values:
// the accuracy the loss's tolerances assume (2 ulp) is tested on exactly this code.
void softmax_exp(const float* x, float* out, int64_t n);

// A counted row. For bucket targets the row's top-k logits are overwritten with −inf while the
// tail is summed (the gradient then rewrites them), so z is scratch when !task.gradient.
RowResult distill_row(const RowTask& task, const Row& row);

}  // namespace deepen::distill_rows
