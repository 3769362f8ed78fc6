// HF Qwen3 config.json and the tensor-name table, checked against what transformers writes and loads.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("deepen-hfc-" + std::to_string(getpid()) + "-" + name);
}

// Runs the reference script; returns (exit code, combined output).
std::pair<int, std::string> python(const std::string& mode, const std::string& path) {
  const std::string log = path + ".log";
  const std::string cmd = std::string(test::kPython) + " " + test::kSourceDir +
                          "/tests/fixtures/safetensors_reference.py " + mode + " '" + path + "' > '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream out;
  out << in.rdbuf();
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out.str()};
}

std::string error_of(const std::string& json_text) {
  return test::error_of([&] { parse_qwen3_config(json_text, "m/config.json"); });
}

// Qwen3-8B's config.json as published (transformers 4.51 era): top-level rope_theta as an integer,
// rope_scaling null, torch_dtype.
const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// kQwen3_8B with `edit` applied (a JSON merge patch: null removes a key).
std::string edited(const nlohmann::json& edit) {
  nlohmann::json j = nlohmann::json::parse(kQwen3_8B);
  j.merge_patch(edit);
  return j.dump();
}

TEST(Qwen3Config, ReadsThePublishedQwen3_8BConfig) {
  const Qwen3Config c = parse_qwen3_config(kQwen3_8B, "Qwen3-8B/config.json");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(Qwen3Config, NestedRopeParametersWinOverTopLevelRopeTheta) {
  // transformers 5 reads the nested form first; a file with both (hand edited) must agree with it.
  const auto c = parse_qwen3_config(edited({{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}}), "x");
  EXPECT_EQ(c.rope_theta, 5000.0);
  const auto d = parse_qwen3_config(edited({{"rope_theta", nullptr}, {"rope_parameters", {{"rope_theta", 250.0}}}}), "x");
  EXPECT_EQ(d.rope_theta, 250.0);
}

TEST(Qwen3Config, AbsentKeysTakeTransformersDefaults) {
  const auto c = parse_qwen3_config(
      edited({{"head_dim", nullptr}, {"rope_theta", nullptr}, {"rms_norm_eps", nullptr}, {"torch_dtype", nullptr}}), "x");
  EXPECT_EQ(c.head_dim, 128) << "transformers' Qwen3 default, not hidden/heads (4096/32 happens to agree here)";
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.torch_dtype, "");
  const auto small = parse_qwen3_config(edited({{"head_dim", nullptr}, {"hidden_size", 64}, {"num_attention_heads", 8}}), "x");
  EXPECT_EQ(small.head_dim, 128) << "never derived as 64/8";
  // An explicit null means "no GQA" in transformers (merge_patch would delete the key, so set it after).
  nlohmann::json null_kv = nlohmann::json::parse(edited({{"num_attention_heads", 8}}));
  null_kv["num_key_value_heads"] = nullptr;
  EXPECT_EQ(parse_qwen3_config(null_kv.dump(), "x").num_key_value_heads, 8);
  const auto new_dtype_key = parse_qwen3_config(edited({{"torch_dtype", nullptr}, {"dtype", "float32"}}), "x");
  EXPECT_EQ(new_dtype_key.torch_dtype, "float32");
}

TEST(Qwen3Config, MalformedJsonNamesTheFile) {
  EXPECT_HAS(error_of(R"({"model_type": "qwen3", )"), "m/config.json: malformed JSON: ");
  EXPECT_HAS(error_of("[1]"), "m/config.json: malformed config: expected a JSON object, got array");
}

TEST(Qwen3Config, MissingRequiredKeyIsNamed) {
  EXPECT_HAS(error_of(edited({{"intermediate_size", nullptr}})), "m/config.json: intermediate_size: missing required key");
  EXPECT_HAS(error_of(edited({{"model_type", nullptr}})), "m/config.json: model_type: missing required key");
}

TEST(Qwen3Config, WrongTypesAndValuesAreNamed) {
  EXPECT_HAS(error_of(edited({{"model_type", "llama"}})), "model_type: expected \"qwen3\", got \"llama\"");
  EXPECT_HAS(error_of(edited({{"hidden_size", "4096"}})), "m/config.json: hidden_size: expected an integer, got \"4096\"");
  EXPECT_HAS(error_of(edited({{"hidden_size", 4096.5}})), "hidden_size: expected an integer, got 4096.5");
  EXPECT_HAS(error_of(edited({{"tie_word_embeddings", 1}})), "tie_word_embeddings: expected true or false, got 1");
  EXPECT_HAS(error_of(edited({{"num_key_value_heads", 5}})), "num_key_value_heads: 5 does not divide num_attention_heads = 32");
  EXPECT_HAS(error_of(edited({{"num_hidden_layers", 0}})), "num_hidden_layers: must be positive, got 0");
  // Absent num_key_value_heads is transformers' default 32, which 4 heads cannot share.
  EXPECT_HAS(error_of(edited({{"num_attention_heads", 4}, {"num_key_value_heads", nullptr}})),
             "num_key_value_heads: 32 (absent: transformers' default) does not divide num_attention_heads = 4");
}

TEST(Qwen3Config, UnsupportedRopeScalingAndAttentionVariantsAreRejected) {
  EXPECT_HAS(error_of(edited({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}})),
             "m/config.json: rope_scaling.rope_type: \"yarn\" is not supported: deepen implements only \"default\" RoPE");
  EXPECT_HAS(error_of(edited({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}})), "\"linear\" is not supported");
  EXPECT_HAS(error_of(edited({{"rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 1.0}}}})),
             "rope_parameters.rope_type: \"llama3\" is not supported");
  EXPECT_HAS(error_of(edited({{"hidden_act", "gelu"}})), "hidden_act: \"gelu\" is not supported");
  EXPECT_HAS(error_of(edited({{"use_sliding_window", true}})), "use_sliding_window: sliding-window attention is not supported");
  EXPECT_HAS(error_of(edited({{"layer_types", {"full_attention", "sliding_attention"}}})),
             "layer_types[1]: \"sliding_attention\" is not supported");
}

TEST(Qwen3Config, ReadFileNamesAMissingFile) {
  try {
    read_qwen3_config("/nonexistent/config.json");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_HAS(e.what(), "/nonexistent/config.json: cannot open");
  }
}

TEST(Qwen3Config, WrittenConfigReadsBackEqual) {
  const fs::path path = scratch("config.json");
  Qwen3Config c;
  c.vocab_size = 50; c.hidden_size = 32; c.intermediate_size = 48; c.num_hidden_layers = 3;
  c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 12; c.max_position_embeddings = 64;
  c.rope_theta = 5000.0; c.rms_norm_eps = 1e-5; c.tie_word_embeddings = true; c.attention_bias = true;
  c.torch_dtype = "float32";
  write_qwen3_config(c, path.string());
  const Qwen3Config r = read_qwen3_config(path.string());
  fs::remove(path);
  EXPECT_EQ(qwen3_config_json(r), qwen3_config_json(c));
  EXPECT_EQ(r.head_dim, 12);
  EXPECT_EQ(r.rope_theta, 5000.0);
  EXPECT_EQ(r.rms_norm_eps, 1e-5);
  EXPECT_TRUE(r.tie_word_embeddings);
  EXPECT_TRUE(r.attention_bias);
}

TEST(HfNames, LayerIndexOfAName) {
  EXPECT_EQ(hf_layer_index("model.layers.12.mlp.up_proj.weight"), 12);
  EXPECT_EQ(hf_layer_index("model.layers.0.input_layernorm.weight"), 0);
  EXPECT_EQ(hf_layer_index("model.norm.weight"), std::nullopt);
  EXPECT_EQ(hf_layer_index("model.layers.x.weight"), std::nullopt);
  EXPECT_EQ(hf_layer_index("model.layers.3"), std::nullopt);
  EXPECT_EQ(hf_layer_prefix(3), "model.layers.3.");
}

TEST(HfNames, LayerTableShapesFollowTheConfig) {
  Qwen3Config c;
  c.hidden_size = 32; c.intermediate_size = 96; c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 16;
  const auto layer = expected_layer_tensors(c, 3);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& e : layer) {
    EXPECT_EQ(e.name, "model.layers.3." + e.part);
    shapes[e.part] = e.shape;
  }
  EXPECT_EQ(shapes.size(), 11u);
  EXPECT_EQ(shapes["self_attn.q_proj.weight"], (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(shapes["self_attn.k_proj.weight"], (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shapes["self_attn.o_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes["self_attn.q_norm.weight"], (std::vector<int64_t>{16}));
  EXPECT_EQ(shapes["mlp.down_proj.weight"], (std::vector<int64_t>{32, 96}));
  c.attention_bias = true;
  EXPECT_EQ(expected_layer_tensors(c, 0).size(), 15u);
  c.tie_word_embeddings = true;
  EXPECT_FALSE(expected_head(c).has_value());
}

// --- Against transformers: checkpoints it writes, and checkpoints it loads ---------------------

class HfQwen3Checkpoints : public ::testing::Test {
 protected:
  // tests/fixtures/safetensors_reference.py write-qwen3: three tiny Qwen3ForCausalLM folders.
  static void SetUpTestSuite() {
    dir_ = scratch("qwen3").string();
    fs::remove_all(dir_);
    const auto [rc, log] = python("write-qwen3", dir_);
    ASSERT_EQ(rc, 0) << log;
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
    fs::remove(dir_ + ".log");
  }
  static std::string folder(const std::string& variant) { return dir_ + "/" + variant; }
  static std::string dir_;
};
std::string HfQwen3Checkpoints::dir_;

// The table names exactly the tensors transformers saves, with the shapes it saves.
TEST_F(HfQwen3Checkpoints, TableMatchesEveryTensorTransformersWrites) {
  for (const std::string variant : {"untied_gqa", "tied_mha", "bias"}) {
    SCOPED_TRACE(variant);
    const Qwen3Config c = read_qwen3_config(folder(variant) + "/config.json");
    EXPECT_EQ(c.num_hidden_layers, 2);
    EXPECT_EQ(c.rope_theta, 5000.0);
    EXPECT_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_EQ(c.max_position_embeddings, 64);
    EXPECT_EQ(c.torch_dtype, "bfloat16");
    const auto ckpt = SafetensorsCheckpoint::open(folder(variant));
    std::set<std::string> expected;
    for (const auto& e : expected_all_tensors(c)) {
      const TensorInfo& info = check_expected_tensor(ckpt, e);
      EXPECT_EQ(info.dtype, DType::BF16);
      expected.insert(e.name);
    }
    const auto names = ckpt.names();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
  }
  EXPECT_EQ(read_qwen3_config(folder("untied_gqa") + "/config.json").head_dim, 16);
  EXPECT_EQ(read_qwen3_config(folder("untied_gqa") + "/config.json").num_key_value_heads, 2);
  EXPECT_TRUE(read_qwen3_config(folder("tied_mha") + "/config.json").tie_word_embeddings);
  EXPECT_TRUE(read_qwen3_config(folder("bias") + "/config.json").attention_bias);
}

std::string check_error(const SafetensorsCheckpoint& ckpt, const Qwen3Config& c) {
  return test::error_of([&] {
    for (const auto& e : expected_all_tensors(c)) check_expected_tensor(ckpt, e);
  });
}

TEST_F(HfQwen3Checkpoints, ShapeMismatchWithTheConfigNamesFileTensorAndBothShapes) {
  Qwen3Config c = read_qwen3_config(folder("untied_gqa") + "/config.json");
  c.intermediate_size = 64;
  const auto ckpt = SafetensorsCheckpoint::open(folder("untied_gqa"));
  EXPECT_HAS(check_error(ckpt, c), folder("untied_gqa") +
                                       "/model.safetensors: tensor model.layers.0.mlp.gate_proj.weight: shape [48, 32], "
                                       "config says [64, 32]");
}

TEST_F(HfQwen3Checkpoints, MissingTensorIsNamed) {
  Qwen3Config c = read_qwen3_config(folder("tied_mha") + "/config.json");
  c.tie_word_embeddings = false;  // the config wants a head the tied checkpoint does not have
  EXPECT_HAS(check_error(SafetensorsCheckpoint::open(folder("tied_mha")), c),
             folder("tied_mha") + ": tensor lm_head.weight: missing");
  c = read_qwen3_config(folder("tied_mha") + "/config.json");
  c.num_hidden_layers = 3;
  EXPECT_HAS(check_error(SafetensorsCheckpoint::open(folder("tied_mha")), c), "tensor model.layers.2.input_layernorm.weight: missing");
}

TEST(HfNames, IntegerDtypeWhereAWeightBelongsIsRejected) {
  const fs::path dir = scratch("dtype");
  fs::create_directories(dir);
  const std::vector<std::byte> bytes(32 * 4);
  write_safetensors((dir / "model.safetensors").string(), {{"model.norm.weight", DType::I32, {32}, bytes}});
  Qwen3Config c;
  c.hidden_size = 32;
  std::string msg;
  try {
    check_expected_tensor(SafetensorsCheckpoint::open(dir.string()), expected_final_norm(c));
  } catch (const InputError& e) {
    msg = e.what();
  }
  fs::remove_all(dir);
  EXPECT_HAS(msg, "/model.safetensors: tensor model.norm.weight: dtype I32, expected a floating dtype");
}

// Writes config.json + model.safetensors for `c` from the name table, with deterministic weights.
void write_checkpoint_from_table(const Qwen3Config& c, const fs::path& dir, const std::string& skip = "") {
  fs::create_directories(dir);
  write_qwen3_config(c, (dir / "config.json").string());
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorToWrite> tensors;
  const auto expected = expected_all_tensors(c);
  storage.reserve(expected.size());
  uint32_t state = 12345;
  for (const auto& e : expected) {
    if (e.name == skip) continue;
    int64_t n = 1;
    for (auto d : e.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / (1 << 24) - 0.5f;
    storage.emplace_back(reinterpret_cast<const std::byte*>(v.data()), reinterpret_cast<const std::byte*>(v.data() + n));
    tensors.push_back({e.name, DType::F32, e.shape, storage.back()});
  }
  write_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
}

// What deepen writes, transformers loads as Qwen3ForCausalLM with every weight matched; the same
// check fails when a tensor is missing, so it is not vacuous.
TEST(HfNames, TransformersLoadsACheckpointWrittenFromTheTable) {
  Qwen3Config c;
  c.vocab_size = 40; c.hidden_size = 24; c.intermediate_size = 40; c.num_hidden_layers = 2;
  c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 10; c.max_position_embeddings = 32;
  c.rope_theta = 321.0; c.attention_bias = true; c.torch_dtype = "float32";
  const fs::path dir = scratch("table-untied");
  write_checkpoint_from_table(c, dir);
  auto [rc, out] = python("load-qwen3", dir.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_HAS(out, R"("class": "Qwen3ForCausalLM")");
  EXPECT_HAS(out, R"("head_dim": 10)");
  EXPECT_HAS(out, R"("rope_theta": 321.0)");
  EXPECT_HAS(out, R"("dtype": "torch.float32")");

  c.tie_word_embeddings = true;
  c.attention_bias = false;
  const fs::path tied = scratch("table-tied");
  write_checkpoint_from_table(c, tied, "model.layers.1.self_attn.k_norm.weight");
  std::tie(rc, out) = python("load-qwen3", tied.string());
  EXPECT_NE(rc, 0) << "transformers accepted a checkpoint missing a tensor:\n" << out;
  EXPECT_HAS(out, "model.layers.1.self_attn.k_norm.weight");
  for (const auto& d : {dir, tied}) {
    fs::remove_all(d);
    fs::remove(d.string() + ".log");
  }
}

}  // namespace
}  // namespace deepen
