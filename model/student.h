// GrowableStudent: a Qwen3-style decoder with a norm placement per layer (pre, post, peri, mix,
// pre_scaled), an active depth that grows (random | stack | identity here; teacher layers through
// curriculum/growth_operator.h), prefix freezing and a parameter checksum for data parallel.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "model/block_gate.h"
#include "model/qwen3.h"

namespace deepen {

struct StudentConfig;

// Everything that fixes the student's shapes and arithmetic.
struct StudentSpec {
  DecoderSpec decoder;
  int64_t vocab_size = 0;
  int64_t max_depth = 0;  // blocks at the end of the curriculum
  NormPlacement norm = NormPlacement::kPre;
  double mix_post_fraction = 0.25;  // mix only: layers [0, ceil(f · max_depth)) are post-norm
  bool tie_embeddings = true;
  // Parameters (and so AdamW state and checkpoints): kFloat or kBFloat16. The compute dtype is
  // decoder.compute_dtype when set (bf16-mixed: fp32 parameters, bf16 compute), else this one.
  at::ScalarType dtype = at::kFloat;
  at::ScalarType compute() const;  // the dtype activations and logits come out in
  // Post-norm only: an RMSNorm `entry_norm` on the embedding output before block 0 (the paper's
  // post-norm boundary norm), so that post- and pre-norm students have the same parameters.
  bool entry_norm = false;
  // The embedding never trains (the paper's student: copied from the teacher and frozen); it holds
  // no gradient and so gets no optimizer state.
  bool freeze_embedding = false;
};

// student.precision (config.h):
//   fp32       -> dtype kFloat,    decoder.compute_dtype kUndefined
//   bf16-mixed -> dtype kFloat,    decoder.compute_dtype kBFloat16 (fp32 masters, bf16 compute)
//   bf16-pure  -> dtype kBFloat16, decoder.compute_dtype kUndefined
// (StudentPrecision: config/options.h)

// From the [student] section and the vocabulary size (the tokenizer's, or the teacher's).
// student.init = "teacher" sets freeze_embedding, and entry_norm for a post-norm student (the
// weights themselves come from copy_teacher_ends, model/student_from_teacher.h).
// Throws InputError "student.<key>: ..." on bad values.
StudentSpec student_spec_from_config(const StudentConfig& cfg, int64_t vocab_size);

// The block a GrowableStudent parameter belongs to ("layers.<i>.…" -> i), -1 for the rest
// (embedding, boundary norm, head).
int64_t block_of_parameter(const std::string& name);

// How appended blocks are initialized (grow_to; "teacher" is curriculum/growth_operator.h's).
//   random:   normal(0, 0.02) weights, unit norms, from a generator seeded by (seed, block index),
//             so block i gets the same weights whenever it is created (a resumed run grows alike).
//   stack:    each new layer copies a layer of the student's last block of `block_layers` layers,
//             in order (G_stack): new layer d + j copies layer d - block_layers + (j mod block_layers),
//             every tensor bit for bit (norm gains included; RoPE has no parameters).
//   identity: random, then o_proj (and its bias) and down_proj zeroed: the new layer's attention and
//             MLP outputs are exactly 0. Function-preserving where the layer adds them to the
//             residual stream: pre, pre_scaled, peri (its output norm maps 0 to 0), mix's pre-norm
//             layers. A post-norm layer still renormalizes its input (norm(x + 0) != x): a post-norm
//             student's function changes; a mix student's only by a per-token scale that its final
//             norm undoes up to eps (measured in docs/model.md).
// (GrowInit, curriculum.grow_init: config/options.h)

// Where the boundary norm sits:
//   pre-norm:  the residual stream is never normalized inside the stack, so (as in Qwen3) a final
//              RMSNorm `norm` sits between the last active block and the head. So do peri, mix and
//              pre_scaled (has_final_norm, model/norm_placement.h).
//   post-norm: every block ends with norm2(h + mlp(h)), so the stack's output is already unit-RMS
//              times a learned gain; the head reads the last active block's output directly and
//              there is no `norm` parameter (an extra norm would only add a redundant gain).
//              With spec.entry_norm (the paper's post-norm student) an RMSNorm `entry_norm` sits
//              on the embedding output instead: block 0 then gets a unit-RMS input like every
//              later block, and the parameter count equals the pre-norm student's.
// Parameter names are Hugging Face's without the "model." prefix: embed_tokens.weight,
// entry_norm.weight (post with entry_norm only), layers.<i>.<block names in qwen3.h>, norm.weight
// (pre only), lm_head.weight (untied only).
// Only active blocks exist as modules, so named_parameters(), state_dict and the checksum cover
// exactly the active model.
class GrowableStudent : public torch::nn::Module {
 public:
  // Builds `depth` blocks (1 <= depth <= spec.max_depth). Every weight is drawn on CPU from a
  // generator seeded by (seed, what it is), then moved to `device` and spec.dtype.
  GrowableStudent(const StudentSpec& spec, int64_t depth, uint64_t seed,
                  at::Device device = at::kCPU);

  const StudentSpec& spec() const { return spec_; }
  int64_t depth() const { return static_cast<int64_t>(layers_->size()); }
  uint64_t seed() const { return seed_; }
  // Where the parameters live (module->to(device) moves them; new blocks and RoPE tables follow).
  at::Device device() const;

  // Adds blocks until depth() == new_depth (<= max_depth, >= depth()). New blocks are trainable.
  // block_layers: the curriculum's block, the unit `stack` copies (the new depth's growth must be
  // a multiple of it, and so must depth()). Throws InputError for a depth out of range, and
  // std::logic_error for kTeacher (it needs the teacher: grow_student in curriculum/growth_operator.h).
  void grow_to(int64_t new_depth, GrowInit init, int64_t block_layers = 1);
  void append(int64_t n, GrowInit init, int64_t block_layers = 1) { grow_to(depth() + n, init, block_layers); }

  // The norm placement of layer i (< spec().max_depth): layer_placement of the spec's placement.
  LayerPlacement placement_of(int64_t layer) const;

  // Freeze control: blocks [0, n_blocks) stop training (requires_grad = false). With
  // freeze_ends (the default) so do the embedding, the boundary norm (final or entry) and an untied
  // lm_head, so that only the blocks after the prefix learn: freezing the input and output ends
  // too keeps tied and untied students the same experiment (a tied head is the embedding) and
  // makes "only appended blocks train" literal. Without it the ends keep training (a frozen
  // embedding, spec.freeze_embedding, stays frozen either way).
  void freeze_prefix(int64_t n_blocks, bool freeze_ends = true);
  // Everything trains again, except an embedding the spec freezes.
  void unfreeze_all();

  // The boundary norm's parameter name: "norm.weight" (pre), "entry_norm.weight" (post with
  // entry_norm), "" (post without: it has none).
  std::string boundary_norm_name() const;

  // 64-bit hash (FNV-1a over 8-byte words) of every active parameter's name, dtype, shape and
  // bytes, in named_parameters() order. Data-parallel students compare it after growth.
  uint64_t parameter_checksum() const;

  // Parameters with requires_grad, in named_parameters() order: what the optimizer steps.
  std::vector<std::pair<std::string, at::Tensor>> named_trainable_parameters() const;

  // ids [B, T] int64 (any device; moved to device()) -> embedding [B, T, hidden], through the
  // entry norm when there is one (the residual stream entering block 0).
  at::Tensor embed(const at::Tensor& ids);
  // Block i (< depth()) on residual input x [B, T, hidden], positions 0..T-1.
  at::Tensor apply_block(int64_t i, const at::Tensor& x);
  // Last block's output -> what the head reads: final norm for pre-norm, identity for post-norm.
  at::Tensor head_input(const at::Tensor& last_block_output);
  // ids -> head_input(...) [B, T, hidden]: what the loss multiplies by head_weight().
  at::Tensor forward_hidden(const at::Tensor& ids);
  // [vocab, hidden]: the embedding when tied, lm_head otherwise, in the compute dtype (a
  // differentiable bf16 copy of the fp32 parameter under bf16-mixed).
  at::Tensor head_weight() const;
  // The parameter behind head_weight(), in its own dtype (the fp32 master under bf16-mixed): what
  // the distillation loss takes, which casts it for its matmuls and hands the gradient back in fp32.
  at::Tensor head_parameter() const;
  // ids -> logits [B, T, vocab] (compute dtype).
  at::Tensor forward(const at::Tensor& ids);
  // Boundary diagnostics: depth()+1 tensors [B, T, hidden]; entry i is the residual stream
  // entering block i, the last is the last active block's output (before any final norm).
  std::vector<at::Tensor> residual_stream(const at::Tensor& ids);

  DecoderBlock block(int64_t i) const;

  // Full sharding: blocks' parameters are gathered through `gate` around each use (forward_hidden,
  // residual_stream, apply_block); nullptr (the default): they are always whole. The gate must
  // outlive its use. Under grad mode without layer recomputation a gathered block stays gathered
  // (its parameters are saved for the backward pass); its owner releases it after the step.
  void set_block_gate(BlockGate* gate) { gate_ = gate; }

 private:
  DecoderBlock make_block(int64_t index) const;  // random init, on device() and spec dtype
  Rotary rotary(int64_t seq_len) const;
  // Block i through the gate (gathered before, released after when no graph keeps it).
  at::Tensor run_block(int64_t i, const at::Tensor& x, const Rotary& rope);

  StudentSpec spec_;
  uint64_t seed_;
  Embedding embed_tokens_{nullptr};
  RMSNorm entry_norm_{nullptr};     // post-norm with spec.entry_norm only
  torch::nn::ModuleList layers_{nullptr};
  RMSNorm norm_{nullptr};           // has_final_norm(spec.norm): all but post
  Projection lm_head_{nullptr};     // untied only
  BlockGate* gate_ = nullptr;
};

}  // namespace deepen
