// The one table of Hugging Face Qwen3 tensor names and the shapes a Qwen3Config implies for them.
//
// HF name                                          shape
// model.embed_tokens.weight                        [vocab, hidden]
// model.layers.{i}.input_layernorm.weight          [hidden]
// model.layers.{i}.self_attn.q_proj.weight         [heads * head_dim, hidden]   (+ .bias [heads * head_dim] if attention_bias)
// model.layers.{i}.self_attn.k_proj.weight         [kv_heads * head_dim, hidden] (+ .bias)
// model.layers.{i}.self_attn.v_proj.weight         [kv_heads * head_dim, hidden] (+ .bias)
// model.layers.{i}.self_attn.o_proj.weight         [hidden, heads * head_dim]   (+ .bias [hidden])
// model.layers.{i}.self_attn.q_norm.weight         [head_dim]
// model.layers.{i}.self_attn.k_norm.weight         [head_dim]
// model.layers.{i}.post_attention_layernorm.weight [hidden]
// model.layers.{i}.mlp.gate_proj.weight            [intermediate, hidden]
// model.layers.{i}.mlp.up_proj.weight              [intermediate, hidden]
// model.layers.{i}.mlp.down_proj.weight            [hidden, intermediate]
// model.norm.weight                                [hidden]
// lm_head.weight                                   [vocab, hidden]   (absent when tie_word_embeddings)
// Weights are [out_features, in_features] as in torch.nn.Linear.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/hf_config.h"
#include "model/safetensors.h"

namespace deepen {

// What one HF tensor must look like under a config.
struct ExpectedTensor {
  std::string name;            // full HF name, e.g. "model.layers.3.mlp.up_proj.weight"
  std::string part;            // name inside its owner: "mlp.up_proj.weight" for a layer tensor,
                               // "embed_tokens.weight", "norm.weight", "lm_head.weight" otherwise
  std::vector<int64_t> shape;  // from the config
};

std::string hf_layer_prefix(int layer);  // 3 -> "model.layers.3."

// The tensors of decoder layer `layer` in HF order (the table above), with biases when
// config.attention_bias.
std::vector<ExpectedTensor> expected_layer_tensors(const Qwen3Config& config, int layer);
ExpectedTensor expected_embedding(const Qwen3Config& config);    // model.embed_tokens.weight
ExpectedTensor expected_final_norm(const Qwen3Config& config);   // model.norm.weight
std::optional<ExpectedTensor> expected_head(const Qwen3Config& config);  // lm_head.weight; nullopt when tied
// Everything a full checkpoint holds: embedding, layers 0..n-1, final norm, head (if untied).
std::vector<ExpectedTensor> expected_all_tensors(const Qwen3Config& config);

// The layer index of an HF name: "model.layers.12.mlp.up_proj.weight" -> 12; others -> nullopt.
std::optional<int> hf_layer_index(const std::string& hf_name);

// Finds `expected.name` in the checkpoint and checks it against the config; returns its info.
// Throws InputError, naming the shard and tensor:
//   "<dir>/model.safetensors: tensor model.layers.3.mlp.up_proj.weight: shape [64, 32], config says [96, 32]"
//   "<dir>/model.safetensors: tensor model.norm.weight: dtype I32, expected a floating dtype (F32, F16, BF16, F64)"
//   "<dir>: tensor lm_head.weight: missing" (or the index/shard form from SafetensorsCheckpoint::info)
const TensorInfo& check_expected_tensor(const SafetensorsCheckpoint& checkpoint, const ExpectedTensor& expected);

}  // namespace deepen
