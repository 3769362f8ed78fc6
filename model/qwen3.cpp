// Qwen3 decoder pieces; each numerical step mirrors transformers' modeling_qwen3.py (5.x).
#include "model/qwen3.h"

#include <cmath>

#include <ATen/ATen.h>

#include "launch/input_error.h"

namespace deepen {

void validate_decoder_spec(const DecoderSpec& spec, const std::string& where) {
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) throw InputError(where + ": " + name + " must be positive, got " + std::to_string(v));
  };
  positive("hidden", spec.hidden);
  positive("heads", spec.heads);
  positive("kv_heads", spec.kv_heads);
  positive("head_dim", spec.head_dim);
  positive("intermediate", spec.intermediate);
  if (spec.heads % spec.kv_heads != 0)
    throw InputError(where + ": heads (" + std::to_string(spec.heads) +
                     ") must be a multiple of kv_heads (" + std::to_string(spec.kv_heads) + ")");
  if (spec.head_dim % 2 != 0)
    throw InputError(where + ": head_dim must be even for rotary embedding, got " +
                     std::to_string(spec.head_dim));
  if (!(spec.rope_theta > 0)) throw InputError(where + ": rope_theta must be positive");
  if (!(spec.rms_eps > 0)) throw InputError(where + ": rms_eps must be positive");
}

NormPlacement parse_norm_placement(const std::string& text, const std::string& where) {
  if (text == "pre") return NormPlacement::kPre;
  if (text == "post") return NormPlacement::kPost;
  throw InputError(where + ": norm must be \"pre\" or \"post\", got \"" + text + "\"");
}

const char* norm_placement_name(NormPlacement norm) {
  return norm == NormPlacement::kPre ? "pre" : "post";
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto in_dtype = x.scalar_type();
  if (in_dtype == at::kFloat && weight.scalar_type() == at::kFloat) {
    // Same arithmetic as below (fp32 throughout), in ATen's single op: fewer autograd nodes.
    return at::rms_norm(x, {x.size(-1)}, weight, eps);
  }
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(var + eps)).to(in_dtype);
}

Rotary make_rotary(int64_t seq_len, int64_t head_dim, double theta, at::ScalarType dtype,
                   at::Device device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // HF: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), all in fp32 on CPU.
  const at::Tensor exponent = at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, exponent).reciprocal();
  // HF: position_ids[..., None].float() * inv_freq; emb = cat((freqs, freqs), -1).
  const at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kLong)).to(at::kFloat);
  const at::Tensor freqs = pos.unsqueeze(-1) * inv_freq;
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return Rotary{emb.cos().to(device, dtype), emb.sin().to(device, dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const Rotary& rope) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half);
  const at::Tensor x2 = x.narrow(-1, half, half);
  const at::Tensor rotated = at::cat({-x2, x1}, -1);
  return x * rope.cos + rotated * rope.sin;
}

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, bool with_bias,
                               const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({out, in}, options));
  if (with_bias) bias = register_parameter("bias", at::zeros({out}, options));
}

at::Tensor ProjectionImpl::forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({vocab, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, const at::TensorOptions& options) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}, options));
}

AttentionImpl::AttentionImpl(const DecoderSpec& s, const at::TensorOptions& options) : spec(s) {
  auto linear = [&](int64_t in, int64_t out) {
    return Projection(in, out, spec.attention_bias, options);
  };
  q_proj = register_module("q_proj", linear(spec.hidden, spec.heads * spec.head_dim));
  k_proj = register_module("k_proj", linear(spec.hidden, spec.kv_heads * spec.head_dim));
  v_proj = register_module("v_proj", linear(spec.hidden, spec.kv_heads * spec.head_dim));
  o_proj = register_module("o_proj", linear(spec.heads * spec.head_dim, spec.hidden));
  q_norm = register_module("q_norm", RMSNorm(spec.head_dim, spec.rms_eps, options));
  k_norm = register_module("k_norm", RMSNorm(spec.head_dim, spec.rms_eps, options));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const Rotary& rope) {
  const int64_t b = x.size(0), t = x.size(1), d = spec.head_dim;
  // [B, T, heads, d] -> per-head RMSNorm over d -> [B, heads, T, d] -> RoPE.
  at::Tensor q = q_norm(q_proj(x).view({b, t, spec.heads, d})).transpose(1, 2);
  at::Tensor k = k_norm(k_proj(x).view({b, t, spec.kv_heads, d})).transpose(1, 2);
  const at::Tensor v = v_proj(x).view({b, t, spec.kv_heads, d}).transpose(1, 2);
  q = apply_rotary(q, rope);
  k = apply_rotary(k, rope);
  // Fused SDPA (flash kernel on CPU and CUDA); enable_gqa lets it read the shared KV heads without
  // materializing repeat_kv. Scale 1/sqrt(head_dim) as HF's `head_dim ** -0.5`.
  const at::Tensor o = at::scaled_dot_product_attention(
      q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/t > 1,
      /*scale=*/std::pow(static_cast<double>(d), -0.5),
      /*enable_gqa=*/spec.kv_heads != spec.heads);
  return o_proj(o.transpose(1, 2).reshape({b, t, spec.heads * d}));
}

MlpImpl::MlpImpl(const DecoderSpec& spec, const at::TensorOptions& options) {
  auto linear = [&](int64_t in, int64_t out) { return Projection(in, out, false, options); };
  gate_proj = register_module("gate_proj", linear(spec.hidden, spec.intermediate));
  up_proj = register_module("up_proj", linear(spec.hidden, spec.intermediate));
  down_proj = register_module("down_proj", linear(spec.intermediate, spec.hidden));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  return down_proj(at::silu(gate_proj(x)) * up_proj(x));
}

DecoderBlockImpl::DecoderBlockImpl(const DecoderSpec& spec, NormPlacement norm,
                                   const at::TensorOptions& options)
    : placement(norm) {
  self_attn = register_module("self_attn", Attention(spec, options));
  mlp = register_module("mlp", Mlp(spec, options));
  input_layernorm = register_module("input_layernorm", RMSNorm(spec.hidden, spec.rms_eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(spec.hidden, spec.rms_eps, options));
}

at::Tensor DecoderBlockImpl::forward(const at::Tensor& x, const Rotary& rope) {
  if (placement == NormPlacement::kPre) {
    const at::Tensor h = x + self_attn(input_layernorm(x), rope);
    return h + mlp(post_attention_layernorm(h));
  }
  const at::Tensor h = input_layernorm(x + self_attn(x, rope));
  return post_attention_layernorm(h + mlp(h));
}

}  // namespace deepen
