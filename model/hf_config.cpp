// Hugging Face Qwen3 config.json: parsing with transformers' defaults and rejections, and writing.
#include "model/hf_config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"

namespace deepen {

namespace {

using nlohmann::json;

// Reads keys of one JSON object; every error names origin and key.
class Reader {
 public:
  Reader(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& reason) const {
    throw InputError(origin_ + ": " + key + ": " + reason);
  }
  // Present and not null (transformers treats null as "use the default").
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t integer(const std::string& key) const {
    if (!j_.contains(key)) fail(key, "missing required key");
    return integer_value(key, j_.at(key));
  }
  void integer(const std::string& key, int64_t& out) const {
    if (has(key)) out = integer_value(key, j_.at(key));
  }
  void number(const std::string& key, double& out) const {
    if (!has(key)) return;
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    out = v.get<double>();
  }
  void boolean(const std::string& key, bool& out) const {
    if (!has(key)) return;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    out = v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }

 private:
  int64_t integer_value(const std::string& key, const json& v) const {
    // 4096.0 is not an integer in transformers either (it would break nn.Linear): reject it.
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail(key, "too large: " + v.dump());
    return v.get<int64_t>();
  }
  const json& j_;
  std::string origin_;
};

// A rope dict (rope_parameters or legacy rope_scaling) must describe plain RoPE: deepen implements
// no YaRN/linear/dynamic/llama3 scaling, and silently ignoring one would change every logit.
void check_default_rope(const Reader& top, const json& rope, const std::string& key) {
  if (!rope.is_object()) top.fail(key, "expected an object, got " + rope.dump());
  for (const auto& [k, v] : rope.items())
    if (v.is_object()) top.fail(key + "." + k, "per-layer-type RoPE parameters are not supported");
  std::string type = "default";
  for (const char* name : {"rope_type", "type"}) {  // "type" is the legacy spelling
    if (rope.contains(name) && !rope.at(name).is_null()) {
      if (!rope.at(name).is_string()) top.fail(key + "." + name, "expected a string, got " + rope.at(name).dump());
      type = rope.at(name).get<std::string>();
      break;
    }
  }
  if (type != "default")
    top.fail(key + ".rope_type", "\"" + type + "\" is not supported: deepen implements only \"default\" RoPE");
}

}  // namespace

Qwen3Config parse_qwen3_config(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw InputError(origin + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw InputError(origin + ": malformed config: expected a JSON object, got " + std::string(j.type_name()));
  const Reader r(j, origin);

  if (!j.contains("model_type")) r.fail("model_type", "missing required key");
  const std::string model_type = r.string("model_type", "");
  if (model_type != "qwen3") r.fail("model_type", "expected \"qwen3\", got \"" + model_type + "\"");

  Qwen3Config c;
  // Structural sizes have no sensible default: transformers would silently build an 8B-shaped
  // model, deepen names the key instead.
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  // transformers: absent -> the dataclass default (32); explicit null -> num_attention_heads.
  // Matched exactly so both read the same model from the same file.
  if (j.contains("num_key_value_heads") && j.at("num_key_value_heads").is_null())
    c.num_key_value_heads = c.num_attention_heads;
  r.integer("num_key_value_heads", c.num_key_value_heads);
  // head_dim is never hidden/heads in transformers' Qwen3: absent means the default 128.
  r.integer("head_dim", c.head_dim);
  r.integer("max_position_embeddings", c.max_position_embeddings);
  r.number("rms_norm_eps", c.rms_norm_eps);
  r.boolean("tie_word_embeddings", c.tie_word_embeddings);
  r.boolean("attention_bias", c.attention_bias);
  c.torch_dtype = r.string("dtype", r.string("torch_dtype", ""));

  // RoPE theta: the nested rope_parameters (transformers >= 5) wins over the legacy top-level key,
  // as in transformers.
  r.number("rope_theta", c.rope_theta);
  if (r.has("rope_scaling")) check_default_rope(r, j.at("rope_scaling"), "rope_scaling");
  if (r.has("rope_parameters")) {
    const json& rope = j.at("rope_parameters");
    check_default_rope(r, rope, "rope_parameters");
    Reader(rope, origin + ": rope_parameters").number("rope_theta", c.rope_theta);
  }

  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", "\"" + act + "\" is not supported: Qwen3's MLP is SwiGLU (\"silu\")");
  bool sliding = false;
  r.boolean("use_sliding_window", sliding);
  if (sliding) r.fail("use_sliding_window", "sliding-window attention is not supported");
  if (r.has("layer_types")) {
    const json& lt = j.at("layer_types");
    if (!lt.is_array()) r.fail("layer_types", "expected an array, got " + lt.dump());
    for (size_t i = 0; i < lt.size(); ++i)
      if (lt[i] != "full_attention")
        r.fail("layer_types[" + std::to_string(i) + "]", lt[i].dump() + " is not supported: only \"full_attention\"");
  }

  // Sizes the model would otherwise fail on deep inside a matmul.
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers}, {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads}, {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [key, v] : positive)
    if (v <= 0) r.fail(key, "must be positive, got " + std::to_string(v));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_key_value_heads", std::to_string(c.num_key_value_heads) +
                                      (j.contains("num_key_value_heads") ? "" : " (absent: transformers' default)") +
                                      " does not divide num_attention_heads = " + std::to_string(c.num_attention_heads));
  if (!(c.rms_norm_eps > 0)) r.fail("rms_norm_eps", "must be positive");
  if (!(c.rope_theta > 0)) r.fail("rope_theta", "must be positive");
  return c;
}

Qwen3Config read_qwen3_config(const std::string& config_json_path) {
  return parse_qwen3_config(read_file_text(config_json_path), config_json_path);
}

std::string qwen3_config_json(const Qwen3Config& c) {
  // Keys and order as transformers 5.24's Qwen3ForCausalLM.save_pretrained writes them.
  nlohmann::ordered_json j;
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = nullptr;
  if (!c.torch_dtype.empty()) j["dtype"] = c.torch_dtype;
  j["eos_token_id"] = nullptr;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.num_hidden_layers), "full_attention");
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["max_window_layers"] = c.num_hidden_layers;
  j["model_type"] = "qwen3";
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["pad_token_id"] = nullptr;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_parameters"] = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["transformers_version"] = "5.24.0";
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["vocab_size"] = c.vocab_size;
  return j.dump(2) + "\n";
}

void write_qwen3_config(const Qwen3Config& config, const std::string& path) {
  const std::string text = qwen3_config_json(config);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + " into place: " + reason);
  }
}

LayerShapes layer_shapes_of(const Qwen3Config& c) {
  return {c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
          c.attention_bias, c.rope_theta};
}

void check_same_layer_shapes(const LayerShapes& student, const LayerShapes& teacher, const std::string& path) {
  const std::string why = " (curriculum.grow_init = \"teacher\" copies them)";
  auto same = [&](const char* key, int64_t mine, const char* hf_key, int64_t theirs) {
    if (mine != theirs)
      throw InputError(std::string("student.") + key + " = " + std::to_string(mine) +
                       " cannot take the teacher's layers: " + path + " has " + hf_key + " = " +
                       std::to_string(theirs) + why);
  };
  same("hidden", student.hidden, "hidden_size", teacher.hidden);
  same("heads", student.heads, "num_attention_heads", teacher.heads);
  same("kv_heads", student.kv_heads, "num_key_value_heads", teacher.kv_heads);
  same("head_dim", student.head_dim, "head_dim", teacher.head_dim);
  same("intermediate", student.intermediate, "intermediate_size", teacher.intermediate);
  if (student.attention_bias != teacher.attention_bias)
    throw InputError("the student's attention biases cannot take the teacher's layers: " + path +
                     " has attention_bias = " + (teacher.attention_bias ? "true" : "false") + why);
  if (student.rope_theta != teacher.rope_theta)
    throw InputError("student.rope_theta = " + std::to_string(student.rope_theta) +
                     " cannot take the teacher's layers: " + path + " has rope_theta = " +
                     std::to_string(teacher.rope_theta) + " (its attention weights were trained with those rotations)" + why);
}

}  // namespace deepen
