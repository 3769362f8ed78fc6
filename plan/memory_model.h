// Memory model for `deepen plan`: bytes per rank of a student (weights, gradients, AdamW state,
// replicated or sharded, activations with or without recomputation, loss, targets) and of a teacher stage.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "plan/cost_model.h"

namespace deepen {

// Bytes per element of what the student holds, by student.precision:
//                 masters  compute copy  gradient  AdamW (2 moments)  activations
//   fp32          4        0             4         8                  4
//   bf16-mixed    4        2             4         8                  2 (+ fp32 norm inputs)
//   bf16-pure     2        0             2         4                  2 (+ fp32 norm inputs)
// The bf16-mixed compute copy is the bf16 cast of each weight made at its use; the linear layers
// keep it for their backward, so at the peak (end of forward) all of them exist.
struct PrecisionBytes {
  int master = 4, compute_copy = 0, gradient = 4, optimizer = 8, activation = 4;
};
PrecisionBytes precision_bytes(StudentPrecision precision);

// Values saved for backward per token by one decoder block (ops path, model/qwen3.cpp), h = hidden,
// q = heads·head_dim, kv = kv_heads·head_dim, I = intermediate, b = bytes of the compute dtype:
//   the inputs of the four RMSNorms (block input h, residual after attention h, q and k), which
//   they keep in fp32 (they normalize in fp32: in bf16 a fp32 copy, in fp32 the tensor itself)
//                                                          4·(2h + q + kv) bytes
//   norm 1 and norm 2: normalized x, gain·x               4h
//   q: normalized, after RoPE (SDPA's input)              2q   (RoPE's products save only cos/sin)
//   k: the same                                           2kv
//   v (SDPA's input)                                      kv
//   SDPA output, o_proj's input (a reshaped copy)         2q
//   MLP: gate, silu(gate), up, silu(gate)·up              4I
//   attention's log-sum-exp                               4·heads bytes
//   total = b·(4h + 4q + 3kv + 4I) + 4·(2h + q + kv) + 4·heads bytes (fp32: 4·(6h + 5q + 4kv + 4I + heads)).
// recompute = "mlp": the MLP sub-layer (norm 2 and the MLP) keeps only its input (h values in the
//   compute dtype) instead of norm 2's fp32 input, its two outputs and the MLP's four tensors.
// recompute = "layer": a block keeps its input only (h values); the whole block's values live again
//   while its backward runs (counted once per rank).
// With either recomputation, the rebuilt values are counted beside the gradients of the MLP's four
// I-wide tensors (4I in the compute dtype) that its backward holds at the same time: with
// activations this small, that moment can be the peak (memory_check, h128 seq1024: "layer" and
// "mlp" measured 1.15x and 1.35x the model without it, once the loss's term stopped over-counting).
// Example (the paper's layer, hidden 4096, 32/8 heads x 128, intermediate 12288, bf16-mixed, none):
//   2·(4·4096 + 4·4096 + 3·1024 + 4·12288) + 4·(8192 + 4096 + 1024) + 4·32
//   = 169,984 + 53,248 + 128 = 223,360 bytes per token.
// closed_form_norms: fp32 on CPU with the op-sequence kernels, whose RMSNorms compute their backward
// in closed form (model/qwen3.cpp) and keep the normalized input and one fp32 scale per row instead
// of the input: the 4·(2h + q + kv) term becomes 4·(2 + heads + kv_heads) (the rows' scales).
double block_activation_bytes_per_token(const ModelShape& m, StudentPrecision precision, Recompute recompute,
                                        bool closed_form_norms = false);

// What decides a student rank's memory.
struct StudentMemoryInput {
  ModelShape student;            // shapes; layers = the depth held (the curriculum's last)
  int64_t tokens = 0;            // per micro-batch: micro_batch × sequence length (documents: max_len)
  StudentPrecision precision = StudentPrecision::kFp32;
  Recompute recompute = Recompute::kNone;
  bool frozen_embedding = false; // student.init = "teacher": the embedding has no gradient or state
  // The loss (train/distill_loss.h): its rows per chunk (distill.row_chunk, 0 = from the budget of
  // train/loss_chunking.h, GPU or CPU), its path (the fused CPU kernel: CPU with cpu_kernels other
  // than "aten"; else ATen ops, with their temporaries), whether it reads a full teacher chunk (full
  // or hidden-state targets; not top-k, not pretraining) and whether it makes or widens that chunk
  // (distill.logits = "hidden", or bf16 full logits).
  int64_t row_chunk = 0;
  bool gpu = true;
  bool loss_fused = false;
  bool full_teacher = false;
  bool teacher_chunk = false;
  double target_bytes_per_token = 0;  // the teacher's logits (or hidden states) as received (0: pretraining)
  double teacher_head_bytes = 0;      // distill.logits = "hidden": the student's copy of the teacher's head
  // parallel.sharding: "none" (every student holds the whole AdamW state) | "grad_op" (the moments
  // split over the `students` ranks, train/sharded_adamw.h) | "full" (the blocks' parameters and
  // every micro-batch's gradients too), and parallel.bucket_cap_mb in bytes.
  Sharding sharding = Sharding::kNone;
  int64_t students = 1;
  double bucket_bytes = 32.0 * (1 << 20);
  // The student runs fp32 on CPU with cpu_kernels = "aten" (block_activation_bytes_per_token).
  bool closed_form_norms = false;
};

// Elements of the largest trainable parameter: the vocab x hidden matrix when the head (untied) or
// the embedding (tied, not frozen) trains, else the largest block matrix (q/o: hidden x heads·head_dim,
// gate/up/down: hidden x intermediate). Paper student (untied, embedding frozen): the head,
// 151,936 x 4,096 = 622,329,856. Sharded reduction gives such a parameter a bucket of its own.
int64_t largest_trainable_params(const ModelShape& m, bool frozen_embedding);

// Bytes of one student rank at its peak: the larger of two moments of a step.
//   forward: the end of a micro-batch's forward (gradients from earlier micro-batches held), the
//     peak of every config so far;
//   optimizer step, sharding = "grad_op" (train/sharded_adamw.cpp): no activations, but this rank's
//     gradient shard (N/S elements, from the first reduce-scatter to the end of the update) beside
//     the whole gradients and one flat bucket while they are reduce-scattered; then the parameter
//     shard (N/S, the updated slices) beside the gradient shard; then beside one bucket of the
//     all-gather. The gradients are dropped bucket by bucket as they are sent, so the parameter
//     shard never meets them:
//       step = weights + AdamW/S + max(gradients + grad shard + bucket, grad shard + param shard,
//                                      param shard + bucket).
//     sharding = "none": weights + gradients + AdamW, and with more than one student the
//     all-reduce's flat copy of every bucket (as large as the gradients) at the end of the backward.
// Under "grad_op" the AdamW moments are 1/S of the replicated ones (+ at most one padding element
// per bucket: a few hundred bytes, left out); weights, the bf16 copy and the gradients stay whole.
// Under "full" (recompute = "layer" only; train/sharded_adamw.h), with B the parameters of one
// block, L blocks and E the rest (embedding, norms, head):
//   weights = master·(E + L·B/S + B)      the ends whole, the blocks as 1/S master slices, one
//                                          block gathered while it computes
//   compute copy = copy·(E + B), gradients = grad·(trainable E + B) (a block's whole gradients
//   live until its buckets are sent), AdamW/S, and held through the forward the step's gradient
//   shard and the micro-batch's beside it (2·master·trainable/S); the update writes the master
//   slices in place (no parameter shard).
struct StudentMemory {
  double weights = 0;       // masters (fp32 / bf16-pure: the parameters)
  double compute_copy = 0;  // bf16-mixed: the bf16 weight copies alive over forward + backward
  double gradients = 0;     // trainable parameters only, whole (accumulated locally under grad_op too)
  double optimizer = 0;     // AdamW's two moments, trainable parameters only; 1/S of them under grad_op
  // Saved for backward by every block, + what a recomputation rebuilds during the backward of one
  // block (recompute = "layer": the whole block; "mlp": its MLP sub-layer, 2h + 4I values).
  double activations = 0;
  double loss = 0;          // the loss: hidden states and their gradient, its chunk, the head's gradient
  double targets = 0;       // the teacher's logits (or hidden states + its head) for one micro-batch
  // grad_op only (0 under "none"): the step's shards of the trainable parameters, in the
  // parameters' dtype, and the largest flat bucket (bucket_cap_mb, or the largest trainable
  // parameter when that is larger: a parameter never spans buckets).
  double grad_shard = 0, param_shard = 0, bucket = 0;
  // full only: the gradient shards held through the forward (the step's, and the micro-batch's
  // reduce-scatter output beside it).
  double held_shards = 0;
  // none over more than one student: the all-reduce's flat copies of the gradients, all alive at
  // the end of the backward until the reductions finish.
  double flat_copies = 0;
  double forward() const {
    return weights + compute_copy + gradients + optimizer + activations + loss + targets + held_shards;
  }
  double step() const {
    return weights + optimizer +
           std::max({gradients + flat_copies + grad_shard + bucket, grad_shard + param_shard, param_shard + bucket});
  }
  double total() const { return std::max(forward(), step()); }
};

// Worked example (tests/plan/memory_model_test.cpp): the tiny student of cost_model_test (2 layers,
// hidden 8, 2/1 heads x 4, intermediate 16, vocab 32, tied: 1,464 parameters), fp32, 16 tokens:
//   weights 5,856, gradients 5,856, AdamW 11,712 bytes; activations per block and token
//   (6·8 + 5·8 + 4·4 + 4·16 + 2) · 4 = 680 bytes, so 2·680·16 = 21,760 bytes;
//   loss: the hidden states and their gradient 2·8·4·16 = 1,024, one chunk of all 16 rows × 32 ×
//   24 bytes (ATen ops on a GPU, CE alone) = 12,288, and the tied head's gradient made in the
//   forward, 32·8·4 = 1,024: 14,336 bytes.
// The same under sharding = "grad_op" over S = 2 with 64-byte buckets: AdamW 11,712 / 2 = 5,856;
//   gradient and parameter shards 1,464 / 2 · 4 = 2,928 each; bucket: the tied 32 x 8 embedding,
//   256 · 4 = 1,024 bytes (> 64); step = 5,856 + 5,856 + max(5,856 + 2,928 + 1,024, 2,928 + 2,928,
//   2,928 + 1,024) = 21,520; forward = 5,856·3 + 21,760 + 14,336 = 53,664, the peak (59,520 replicated).
//   At 1 token per micro-batch the step is the peak: forward = 17,568 + 1,360 + (64 + 768 + 1,024)
//   = 20,784 < 21,520.
// The ATen path's temporaries (about ten fp32 chunk-sized tensors beside the chunk) are measured,
// not derived: loss_memory_bench (see train/loss_chunking.h).
StudentMemory student_memory(const StudentMemoryInput& in);

// From a plan: the student at full depth, micro_batch_tokens(in) tokens, the configured logits,
// sharding over in.students (a layout search sets in.students to each layout's S).
StudentMemoryInput student_memory_input(const PlanInput& in);

// "80GiB", "80 GB", "141e9", "512MiB" -> bytes (KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB of
// 1024, B or nothing = bytes). InputError naming `where` for anything else.
double parse_bytes(const std::string& text, const std::string& where);

// Bytes of one teacher stage rank: its weights (embedding on the first stage, final norm and head on
// the last), the forward's working set for one micro-batch (no grad: about 4 hidden-sized and 3
// intermediate-sized tensors of one layer at a time, plus the last stage's logits unless
// `logits_in_place`), and its outgoing buffers (max_in_flight micro-batches of activations, or of
// the last stage's output). logits_in_place: the full channel, whose head writes the logits
// straight into an outgoing buffer (LogitChannelSender::logits_buffer), so they are no tensor of
// their own; the top-k channel makes the stage-dtype logits first and sends their top k.
struct TeacherStageMemory {
  double weights = 0, working = 0, buffers = 0;
  double total() const { return weights + working + buffers; }
};
TeacherStageMemory teacher_stage_memory(const ModelShape& teacher, int64_t layers, bool first, bool last,
                                        int dtype_bytes, int64_t tokens, double out_bytes_per_token,
                                        int64_t max_in_flight, bool logits_in_place = false);

// The largest teacher stage of a P-stage pipeline for a plan (plan/cost_model.h), its last stage's
// outgoing buffers for in.shared_runs runs.
TeacherStageMemory planned_teacher_stage(const PlanInput& in, int64_t P);

}  // namespace deepen
