// Hugging Face Qwen3 config.json: reading (with transformers' defaults) and writing.
#pragma once

#include <cstdint>
#include <string>

namespace deepen {

// The fields of a transformers Qwen3Config that the model needs. Defaults are transformers'
// (5.24) own, used when a key is absent from config.json.
struct Qwen3Config {
  int64_t vocab_size = 151936;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 22016;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // absent or null: num_attention_heads (no GQA)
  int64_t head_dim = 128;            // read from the file; absent: 128 as in transformers, never hidden/heads
  int64_t max_position_embeddings = 32768;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;       // q/k/v/o projections carry a bias
  std::string torch_dtype = "";      // "bfloat16", "float32", ... as in the file ("dtype" or "torch_dtype"); "" if absent
};

// The shapes and RoPE of one decoder layer, as a student's config or a teacher's config.json gives
// them: what copying a teacher's layer into a student's needs equal.
struct LayerShapes {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  bool attention_bias = false;
  double rope_theta = 0;
};
LayerShapes layer_shapes_of(const Qwen3Config& config);

// Throws InputError naming the first field that differs, the student key and the teacher's:
//   "student.intermediate = 96 cannot take the teacher's layers: <path> has intermediate_size = 384
//    (curriculum.grow_init = "teacher" copies them)"
void check_same_layer_shapes(const LayerShapes& student, const LayerShapes& teacher, const std::string& teacher_config_path);

// Reads config.json. Requires model_type "qwen3" and the keys vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads (a missing one is named); rope theta
// comes from top-level rope_theta or the newer nested rope_parameters {rope_type, rope_theta}.
// Rejects what deepen does not implement: rope types other than "default" (rope_parameters or
// legacy rope_scaling), hidden_act other than "silu", sliding-window attention. Every error is an
// InputError "<path>: <key>: <reason>" (malformed JSON: "<path>: malformed JSON: <parser message>").
// Also validates shapes: all sizes positive, heads divisible by kv heads.
Qwen3Config read_qwen3_config(const std::string& config_json_path);

// The same from JSON text; `origin` names it in errors.
Qwen3Config parse_qwen3_config(const std::string& json_text, const std::string& origin);

// The config.json transformers writes for Qwen3ForCausalLM (architectures, model_type, dtype,
// rope_parameters, layer_types, ...), so AutoModelForCausalLM.from_pretrained loads it as Qwen3.
// Written to <path>.tmp then renamed.
std::string qwen3_config_json(const Qwen3Config& config);
void write_qwen3_config(const Qwen3Config& config, const std::string& path);

}  // namespace deepen
