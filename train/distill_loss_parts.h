// Inside the distillation loss: its inputs flattened to rows and checked once, and the row-chunked
// loss distill_loss() runs. For train/distill_loss.cpp and train/row_chunked_loss.cpp only.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "train/distill_loss.h"

namespace deepen::distill_detail {

enum class Mode : int64_t { kNone = 0, kFull = 1, kTopk = 2, kSampled = 3 };

// The inputs flattened to rows and checked once, shared by the loss and the reference loss.
struct Prepared {
  at::Tensor h;          // [N, H]
  at::Tensor w;          // [V, H], as given (a bf16 student's fp32 master stays fp32 here)
  Mode mode = Mode::kNone;
  at::Tensor t_logits;   // full: [N, V]
  at::Tensor t_hidden;   // full, sent as hidden states: [N, Ht], with t_head [V, Ht] (t = t_hidden·t_headᵀ)
  at::Tensor t_head;
  at::Tensor t_values;   // top-k: [N, k] in the compute dtype
  at::Tensor t_idx;      // top-k, sampled: [N, k] int64
  at::Tensor t_weights;  // sampled: [N, k] in the compute dtype (c_j / K)
  at::Tensor t_entropy;  // sampled: [N] fp64, the teacher's entropy
  at::Tensor labels;     // [N] int64, or undefined
  at::Tensor valid;      // [N] bool: counted rows
  int64_t n = 0, hdim = 0, vocab = 0;
  at::ScalarType acc = at::kFloat;  // compute dtype of the row arithmetic: fp32 (fp64 for fp64 hidden)
};

Prepared prepare(const at::Tensor& hidden, const at::Tensor& weight, const TeacherTargets& teacher,
                 const at::Tensor& labels, const DistillLossOptions& o);

// "[2, 3]"
std::string shape_of(const at::Tensor& t);

// The gradient-in-forward loss over row chunks (row_chunked_loss.cpp). need_h / need_w: which
// gradients to make (grad mode on and the input requires grad).
DistillLoss row_chunked_loss(const Prepared& p, const DistillLossOptions& o, bool need_h, bool need_w,
                             DistillLossWorkspace* workspace);

}  // namespace deepen::distill_detail
