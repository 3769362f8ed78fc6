// Qwen3 decoder pieces (RMSNorm, RoPE, GQA attention with QK-norm, SwiGLU MLP, one decoder block
// with pre- or post-norm placement), numerically as Hugging Face transformers' modeling_qwen3.py.
#pragma once

#include <cstdint>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/cpu_kernel_choice.h"
#include "model/hf_config.h"
#include "model/norm_placement.h"
#include "model/recompute.h"

namespace deepen {

// Shapes of one decoder layer. head_dim is its own field (Qwen3 sets it independently of
// hidden / heads: Qwen3-8B has hidden 4096, 32 heads, head_dim 128), never derived.
struct DecoderSpec {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;     // GQA: heads % kv_heads == 0
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  double rope_theta = 1'000'000.0;
  double rms_eps = 1e-6;
  bool attention_bias = false;  // q/k/v/o biases (Qwen3 checkpoints: false)
  // fp32 on CPU, per step (cpu_kernel_choice.h): the fused q|k|v projection (one matmul) and the
  // hand-fused kernels of fused_kernels.h, or LibTorch's ops in the HF
  // forward sequence (RMSNorm with a closed-form backward); auto takes whichever this machine runs
  // faster. Same math either way (tests compare both, values and gradients). bf16 and CUDA always
  // run the HF op sequence (RoPE as a roll everywhere: bit for bit the same).
  CpuKernels cpu_kernels = CpuKernels::kAuto;
  // Activation recomputation under training (recompute.h): kMlp is applied inside each block,
  // kLayer around whole blocks by their owner (the student).
  Recompute recompute = Recompute::kNone;
  // Mixed precision: the dtype the forward computes in when it differs from the parameters' (fp32
  // parameters, bf16 compute: each weight is cast at its use, so autograd hands the cast's gradient
  // back to the fp32 parameter in fp32). Undefined = the parameters' own dtype (teacher, fp32 and
  // pure-bf16 students).
  at::ScalarType compute_dtype = at::ScalarType::Undefined;
};

// The weight as a forward uses it: `w` itself, or its copy in `compute` (not Undefined and not
// w's dtype). Differentiable: the copy's gradient reaches w in w's dtype. Undefined stays undefined.
at::Tensor in_compute_dtype(const at::Tensor& w, at::ScalarType compute);

// Throws InputError "<where>: <field> ..." when a size is not positive or heads % kv_heads != 0.
void validate_decoder_spec(const DecoderSpec& spec, const std::string& where);

// The layer shapes of a Hugging Face Qwen3 config.json, for the teacher's stages and for a student
// read back from its export; the execution fields (cpu_kernels, recompute, compute_dtype) keep their
// defaults.
DecoderSpec decoder_spec_from(const Qwen3Config& config);

// Where RMSNorm sits relative to the residual add, per layer (LayerPlacement: model/norm_placement.h).
//   pre  (Qwen3):  h = x + attn(s·norm1(x));  y = h + mlp(s·norm2(h))   s = 1, or 1/sqrt(l) (pre_scaled)
//   post:          h = norm1(x + attn(x));    y = norm2(h + mlp(h))
//   peri:          h = x + attn_out(attn(norm1(x)));  y = h + mlp_out(mlp(norm2(h)))
// (NormPlacement, student.norm: config/options.h; which layers get which: layer_placement)

// HF's Qwen3RMSNorm: normalize in fp32, cast back to x's dtype, THEN multiply by the weight (in
// the weight's dtype). For bf16 the order matters: weight * bf16(x_hat), not bf16(weight * x_hat).
// On fp32 CPU tensors the fused kernel (one pass forward, one backward) may run instead, as chosen
// by `kernels` (cpu_kernel_choice.h).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                    CpuKernels kernels = CpuKernels::kAuto);

// cos/sin tables of rotary embedding for positions 0..seq_len-1, [seq_len, head_dim], computed as
// HF does (inv_freq = 1 / theta^(arange(0, d, 2) / d) in fp32, angle = pos * inv_freq in fp32,
// emb = cat(angle, angle)) and then cast to the compute dtype.
struct Rotary {
  at::Tensor cos;
  at::Tensor sin;
  // sin with its first half negated: rotate_half(x) * sin == roll(x, d/2) * sin_signed exactly (a
  // sign moves from x to the table), so apply_rotary needs no neg and no slices of x.
  at::Tensor sin_signed;
};
Rotary make_rotary(int64_t seq_len, int64_t head_dim, double theta, at::ScalarType dtype,
                   at::Device device);

// x [B, heads, T, head_dim] -> x * cos + rotate_half(x) * sin, rotate_half being the half-split
// convention cat(-x2, x1) (not the interleaved-pairs one). Computed as x * cos + roll(x, d/2) *
// sin_signed: the same values bit for bit, forward and backward, in two fewer ops each way.
at::Tensor apply_rotary(const at::Tensor& x, const Rotary& rope);

// Modules below allocate their weights with at::empty (uninitialized, nothing touched) in the
// given dtype/device, so a 8B-teacher stage is not first built in fp32 and randomly initialized:
// the owner fills every weight (GrowableStudent draws them, TeacherStage copies the checkpoint's).
// RMSNorm weights start at 1.

// y = x W^T (+ b), W [out, in] as torch.nn.Linear.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in, int64_t out, bool bias, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  at::Tensor bias;  // undefined without bias
  at::ScalarType compute_dtype = at::ScalarType::Undefined;  // DecoderSpec::compute_dtype
};
TORCH_MODULE(Projection);

// Token embedding table [vocab, hidden].
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
  at::ScalarType compute_dtype = at::ScalarType::Undefined;  // DecoderSpec::compute_dtype
};
TORCH_MODULE(Embedding);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options,
              CpuKernels kernels = CpuKernels::kAuto);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
  CpuKernels kernels;
  at::ScalarType compute_dtype = at::ScalarType::Undefined;  // DecoderSpec::compute_dtype
  // Multiplies the output (pre_scaled's 1/sqrt(l)), applied to the gain in fp32 before any cast:
  // y = x_hat * (weight * output_scale), one multiply per gain element instead of one per activation.
  double output_scale = 1.0;
};
TORCH_MODULE(RMSNorm);

// Causal self-attention with grouped KV heads and per-head RMSNorm on q and k before RoPE.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const DecoderSpec& spec, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const Rotary& rope);
  DecoderSpec spec;
  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(Attention);

// SwiGLU: down(silu(gate(x)) * up(x)).
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const DecoderSpec& spec, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);
  CpuKernels cpu_kernels;
  at::ScalarType compute_dtype;  // DecoderSpec::compute_dtype
  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

// One decoder block. Its parameter names are Hugging Face's, relative to `model.layers.<i>.`:
//   self_attn.{q,k,v,o}_proj.weight, self_attn.{q,k}_norm.weight, mlp.{gate,up,down}_proj.weight,
//   input_layernorm.weight (the attention sub-layer's norm), post_attention_layernorm.weight (the
//   MLP sub-layer's norm). For post-norm the same two names hold norm1 (after the attention add)
//   and norm2 (after the MLP add), so one name table serves both placements. Peri-norm adds the
//   output norms attn_output_layernorm.weight and mlp_output_layernorm.weight (after the two
//   names above, so every other parameter keeps its place and its draw).
class DecoderBlockImpl : public torch::nn::Module {
 public:
  DecoderBlockImpl(const DecoderSpec& spec, LayerPlacement placement, const at::TensorOptions& options);
  // x: residual stream [B, T, hidden] at positions 0..T-1; rope from make_rotary(T, ...).
  at::Tensor forward(const at::Tensor& x, const Rotary& rope);
  LayerPlacement placement;
  bool recompute_mlp = false;  // spec.recompute == kMlp
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RMSNorm attn_output_layernorm{nullptr}, mlp_output_layernorm{nullptr};  // peri only
};
TORCH_MODULE(DecoderBlock);

}  // namespace deepen
