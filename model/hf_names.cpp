// The HF Qwen3 tensor-name table and the shape check a loader runs on each tensor.
#include "model/hf_names.h"

#include <charconv>

#include "config/input_error.h"

namespace deepen {

std::string hf_layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

std::vector<ExpectedTensor> expected_layer_tensors(const Qwen3Config& c, int layer) {
  const int64_t hidden = c.hidden_size, q_out = c.num_attention_heads * c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  // Order of modeling_qwen3.Qwen3DecoderLayer: input norm, attention, post-attention norm, MLP.
  std::vector<std::pair<std::string, std::vector<int64_t>>> parts = {
      {"input_layernorm.weight", {hidden}},
      {"self_attn.q_proj.weight", {q_out, hidden}},
      {"self_attn.k_proj.weight", {kv_out, hidden}},
      {"self_attn.v_proj.weight", {kv_out, hidden}},
      {"self_attn.o_proj.weight", {hidden, q_out}},
      {"self_attn.q_norm.weight", {c.head_dim}},
      {"self_attn.k_norm.weight", {c.head_dim}},
      {"post_attention_layernorm.weight", {hidden}},
      {"mlp.gate_proj.weight", {inter, hidden}},
      {"mlp.up_proj.weight", {inter, hidden}},
      {"mlp.down_proj.weight", {hidden, inter}},
  };
  if (c.attention_bias) {  // Qwen3Attention gives all four projections bias=config.attention_bias
    const std::vector<std::pair<std::string, std::vector<int64_t>>> biases = {
        {"self_attn.q_proj.bias", {q_out}}, {"self_attn.k_proj.bias", {kv_out}},
        {"self_attn.v_proj.bias", {kv_out}}, {"self_attn.o_proj.bias", {hidden}}};
    parts.insert(parts.begin() + 5, biases.begin(), biases.end());
  }
  const std::string prefix = hf_layer_prefix(layer);
  std::vector<ExpectedTensor> out;
  out.reserve(parts.size());
  for (auto& [part, shape] : parts) out.push_back({prefix + part, part, std::move(shape)});
  return out;
}

ExpectedTensor expected_embedding(const Qwen3Config& c) {
  return {"model.embed_tokens.weight", "embed_tokens.weight", {c.vocab_size, c.hidden_size}};
}

ExpectedTensor expected_final_norm(const Qwen3Config& c) { return {"model.norm.weight", "norm.weight", {c.hidden_size}}; }

std::optional<ExpectedTensor> expected_head(const Qwen3Config& c) {
  // Tied: the head reuses model.embed_tokens.weight and HF checkpoints omit lm_head.weight.
  if (c.tie_word_embeddings) return std::nullopt;
  return ExpectedTensor{"lm_head.weight", "lm_head.weight", {c.vocab_size, c.hidden_size}};
}

std::vector<ExpectedTensor> expected_all_tensors(const Qwen3Config& c) {
  std::vector<ExpectedTensor> out = {expected_embedding(c)};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto layer = expected_layer_tensors(c, static_cast<int>(i));
    out.insert(out.end(), std::make_move_iterator(layer.begin()), std::make_move_iterator(layer.end()));
  }
  out.push_back(expected_final_norm(c));
  if (auto head = expected_head(c)) out.push_back(std::move(*head));
  return out;
}

std::optional<int> hf_layer_index(const std::string& hf_name) {
  static constexpr std::string_view kPrefix = "model.layers.";
  if (hf_name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  const char* begin = hf_name.data() + kPrefix.size();
  const char* end = hf_name.data() + hf_name.size();
  int layer = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, layer);
  if (ec != std::errc() || ptr == begin || ptr == end || *ptr != '.' || layer < 0) return std::nullopt;
  return layer;
}

const TensorInfo& check_expected_tensor(const SafetensorsCheckpoint& checkpoint, const ExpectedTensor& expected) {
  const TensorInfo& info = checkpoint.info(expected.name);  // throws "...: tensor X: missing"
  const std::string where = checkpoint.file_of(expected.name) + ": tensor " + expected.name;
  if (!is_floating(info.dtype))
    throw InputError(where + ": dtype " + dtype_name(info.dtype) + ", expected a floating dtype (F32, F16, BF16, F64)");
  if (info.shape != expected.shape)
    throw InputError(where + ": shape " + shape_string(info.shape) + ", config says " + shape_string(expected.shape));
  return info;
}

}  // namespace deepen
