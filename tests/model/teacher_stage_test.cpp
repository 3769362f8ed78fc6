// TeacherStage: a pipeline of 2 or 3 stages gives the logits of one stage; a stage reads only its
// own tensors and shards; bad checkpoints are errors naming the file and tensor; config.json's layer
// shapes reach the stage's DecoderSpec.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <tuple>

#include "config/input_error.h"
#include "model/hf_config.h"
#include "model/layer_split.h"
#include "model/qwen3.h"
#include "model/teacher_stage.h"
#include "model/tensor_bridge.h"
#include "tests/model/qwen3_fixtures.h"

namespace deepen {
namespace {

at::Tensor run_pipeline(const std::string& dir, int stages, const at::Tensor& ids) {
  const int layers = static_cast<int>(read_qwen3_config(dir + "/config.json").num_hidden_layers);
  const auto ranges = split_layers(layers, stages);
  at::Tensor x = ids;
  for (size_t s = 0; s < ranges.size(); ++s) {
    TeacherStage stage(dir, ranges[s].first, ranges[s].second, s == 0, s + 1 == ranges.size(), at::kFloat);
    x = stage.forward(x);
  }
  return x;
}

// The teacher's stages and a student read back from its export build their layers from one mapping
// of config.json: every layer shape comes from the file (distinct values, so a swapped field shows),
// and how the layers execute stays at its defaults.
TEST(DecoderSpecFrom, TakesEveryLayerShapeFromTheConfig) {
  const DecoderSpec s = decoder_spec_from(parse_qwen3_config(R"({"model_type": "qwen3", "vocab_size": 512,
      "hidden_size": 96, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 6,
      "num_key_value_heads": 3, "head_dim": 20, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
      "attention_bias": true})", "config.json"));
  EXPECT_EQ(std::tuple(s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate), std::tuple(96, 6, 3, 20, 224));
  EXPECT_EQ(std::tuple(s.rope_theta, s.rms_eps, s.attention_bias), std::tuple(5e5, 1e-5, true));
  const DecoderSpec defaults;
  EXPECT_EQ(std::tuple(s.cpu_kernels, s.recompute, s.compute_dtype),
            std::tuple(defaults.cpu_kernels, defaults.recompute, defaults.compute_dtype));
}

TEST(SplitLayers, BalancedWithTheRemainderOnTheFirstStages) {
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(split_layers(36, 4), (R{{0, 9}, {9, 18}, {18, 27}, {27, 36}}));
  EXPECT_EQ(split_layers(10, 3), (R{{0, 4}, {4, 7}, {7, 10}}));
  EXPECT_EQ(split_layers(5, 1), (R{{0, 5}}));
  EXPECT_EQ(split_layers(3, 3), (R{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_THROW(split_layers(3, 4), InputError);
  EXPECT_THROW(split_layers(3, 0), InputError);
}

TEST(SplitLayers, CountingTheHeadMovesLayersOffTheLastStage) {
  using R = std::vector<std::pair<int, int>>;
  const double head_8b = lm_head_layer_equivalents(151936, 4096, 32, 8, 128, 12288);
  EXPECT_NEAR(head_8b, 3.226, 0.001);  // 622.3M head multiply-adds / 192.9M per layer
  // Qwen3-8B on 4 stages: the last stage carries the head, so it gets 6 layers (9.2 layers' worth)
  // and the others 10; with the hidden channel it has no head and the split is the plain one.
  EXPECT_EQ(split_layers_with_head(36, 4, head_8b), (R{{0, 10}, {10, 20}, {20, 30}, {30, 36}}));
  EXPECT_EQ(split_layers_with_head(36, 4, 0), (R{{0, 9}, {9, 18}, {18, 27}, {27, 36}}));
  EXPECT_EQ(split_layers_with_head(36, 2, head_8b), (R{{0, 20}, {20, 36}}));
  EXPECT_EQ(split_layers_with_head(28, 4, 3.2), (R{{0, 8}, {8, 16}, {16, 24}, {24, 28}}));
  EXPECT_EQ(split_layers_with_head(10, 3, 3.2), (R{{0, 5}, {5, 9}, {9, 10}}));
  EXPECT_EQ(split_layers_with_head(5, 1, 3.2), (R{{0, 5}}));
  // Every stage still gets a layer, however heavy the head.
  EXPECT_EQ(split_layers_with_head(3, 3, 100), (R{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_THROW(split_layers_with_head(3, 4, 1), InputError);
  EXPECT_THROW(split_layers_with_head(3, 2, -1), InputError);
}

// What the distributed job and the plan split by: the head counted for full and top-k logits,
// not for the hidden-state channel.
TEST(SplitLayers, TheLastStageCountsTheHeadUnlessTheStudentsRunIt) {
  const double head_8b = lm_head_layer_equivalents(151936, 4096, 32, 8, 128, 12288);
  EXPECT_EQ(last_stage_head_layers(TeacherOutput::kFull, 151936, 4096, 32, 8, 128, 12288), head_8b);
  EXPECT_EQ(last_stage_head_layers(TeacherOutput::kTopk, 151936, 4096, 32, 8, 128, 12288), head_8b);
  EXPECT_EQ(last_stage_head_layers(TeacherOutput::kHidden, 151936, 4096, 32, 8, 128, 12288), 0.0);
}

TEST(SplitLayers, WithoutAHeadTheSplitIsThePlainOne) {
  for (int layers = 1; layers <= 60; ++layers)
    for (int stages = 1; stages <= layers; ++stages)
      EXPECT_EQ(split_layers_with_head(layers, stages, 0), split_layers(layers, stages)) << layers << "/" << stages;
}

TEST(SplitLayers, CountingTheHeadNeverMakesTheCostliestStageDearer) {
  // The plain split's costliest stage (its last carries the head) bounds the counted split's.
  auto worst = [](const std::vector<std::pair<int, int>>& r, double head) {
    double w = 0;
    for (size_t s = 0; s < r.size(); ++s) w = std::max(w, (r[s].second - r[s].first) + (s + 1 == r.size() ? head : 0.0));
    return w;
  };
  for (double head : {0.5, 1.0, 3.2, 7.0})
    for (int layers = 2; layers <= 40; ++layers)
      for (int stages = 2; stages <= std::min(layers, 8); ++stages)
        EXPECT_LE(worst(split_layers_with_head(layers, stages, head), head), worst(split_layers(layers, stages), head))
            << layers << "/" << stages << " head " << head;
}

TEST(TeacherStage, TwoAndThreeStagesGiveTheSameLogitsAsOne) {
  for (const std::string name : {"untied_gqa_sharded", "tied_gqa", "untied_mha"}) {
    const std::string dir = test::tiny_qwen3_fixtures() + "/" + name;
    const auto ids = test::read_ids(dir + "/ids.txt");
    const int layers = static_cast<int>(read_qwen3_config(dir + "/config.json").num_hidden_layers);
    for (const auto& line : ids) {
      const at::Tensor whole = run_pipeline(dir, 1, line);
      // Derived bound: 0. Stages run the same layers' operations on the same fp32 values in the same
      // order (activations pass between stages in fp32), so the logits are equal bit for bit.
      for (int stages = 2; stages <= std::min(3, layers); ++stages)
        EXPECT_LE(test::max_abs_diff(run_pipeline(dir, stages, line), whole), 1e-6)
            << name << " with " << stages << " stages";
    }
  }
}

TEST(TeacherStage, BatchedSequencesMatchSequencesRunAlone) {
  const std::string dir = test::tiny_qwen3_fixtures() + "/untied_gqa_sharded";
  const at::Tensor ids = at::randint(0, 97, {3, 9}, at::kLong);
  TeacherStage model(dir, 0, 5, true, true, at::kFloat);
  const at::Tensor batched = model.forward(ids);
  for (int64_t b = 0; b < 3; ++b)
    EXPECT_LE(test::max_abs_diff(batched[b], model.forward(ids.slice(0, b, b + 1))[0]), 1e-5);
}

TEST(TeacherStage, MiddleStageReadsOnlyItsLayersAndTheirShards) {
  const std::string dir = test::tiny_qwen3_fixtures() + "/untied_gqa_sharded";
  TeacherStage stage(dir, 2, 4, false, false, at::kFloat);
  ASSERT_FALSE(stage.loaded_tensor_names().empty());
  for (const std::string& name : stage.loaded_tensor_names()) {
    const bool in_range = name.rfind("model.layers.2.", 0) == 0 || name.rfind("model.layers.3.", 0) == 0;
    EXPECT_TRUE(in_range) << name;
  }
  EXPECT_EQ(stage.loaded_tensor_names().size(), 2u * 11u);  // 11 tensors per layer without biases
  const auto shards = SafetensorsCheckpoint::open(dir);
  std::set<std::string> needed;
  for (const std::string& name : stage.loaded_tensor_names()) needed.insert(shards.file_of(name));
  const std::set<std::string> opened(stage.opened_files().begin(), stage.opened_files().end());
  EXPECT_EQ(opened, needed);
  size_t shard_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().rfind("model-", 0) == 0) ++shard_files;
  EXPECT_LT(opened.size(), shard_files);
}

// Copies the tied_gqa fixture with its tensors passed through `edit`, returns the folder.
template <class Edit>
std::string edited_checkpoint(const std::string& name, Edit edit) {
  const std::string src = test::tiny_qwen3_fixtures() + "/tied_gqa";
  const std::string dst = test::temp_dir(name);
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
  const SafetensorsFile file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const TensorInfo& info : file.tensors()) tensors.emplace_back(info.name, file_tensor(file, info).clone());
  edit(tensors);
  write_tensors(dst + "/model.safetensors", tensors);
  return dst;
}

void expect_input_error(const std::string& dir, const std::string& needle) {
  try {
    TeacherStage stage(dir, 0, 2, true, true, at::kFloat);
    ADD_FAILURE() << "expected InputError containing: " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TeacherStage, TensorShapeDisagreeingWithConfigIsNamed) {
  const std::string dir = edited_checkpoint("teacher_bad_shape", [](auto& tensors) {
    for (auto& [name, t] : tensors)
      if (name == "model.layers.1.mlp.up_proj.weight") t = t.narrow(0, 0, 60).contiguous();
  });
  expect_input_error(dir, "model.safetensors: tensor model.layers.1.mlp.up_proj.weight: shape [60, 32]");
}

TEST(TeacherStage, MissingTensorIsNamed) {
  const std::string dir = edited_checkpoint("teacher_missing", [](auto& tensors) {
    std::erase_if(tensors, [](const auto& t) { return t.first == "model.layers.0.self_attn.k_norm.weight"; });
  });
  expect_input_error(dir, "tensor model.layers.0.self_attn.k_norm.weight: missing");
}

TEST(TeacherStage, IntegerTensorIsRejected) {
  const std::string dir = edited_checkpoint("teacher_int", [](auto& tensors) {
    for (auto& [name, t] : tensors)
      if (name == "model.norm.weight") t = t.to(at::kInt);
  });
  expect_input_error(dir, "tensor model.norm.weight: dtype I32");
}

// The hidden-state channel: the last stage without its head returns the final normalised hidden
// states, and the head a student reads on its own (lm_head, or the tied embedding) turns them into
// the logits the headed stage returns. Derived bound: 0 up to the head matmul's summation order
// (at::linear vs at::matmul over the same H fp32 products, each within γ_H·Σ|g||u| of exact):
// |Δ| ≤ 2·γ_H·max Σ_k |g_k||u_jk|.
TEST(TeacherStage, HeadlessLastStageAndTheHeadAloneGiveTheLogits) {
  for (const std::string name : {"untied_gqa_sharded", "tied_gqa"}) {
    const std::string dir = test::tiny_qwen3_fixtures() + "/" + name;
    const int layers = static_cast<int>(read_qwen3_config(dir + "/config.json").num_hidden_layers);
    const at::Tensor ids = test::read_ids(dir + "/ids.txt").front();
    TeacherStage headed(dir, 0, layers, true, true, at::kFloat);
    TeacherStage headless(dir, 0, layers, true, true, at::kFloat, at::kCPU, CpuKernels::kAuto, /*with_head=*/false);
    const at::Tensor head = load_teacher_head(dir, at::kFloat);
    const at::Tensor g = headless.forward(ids);
    ASSERT_EQ(g.size(-1), head.size(1)) << name;
    const at::Tensor logits = at::matmul(g, head.t());
    const double scale = at::matmul(g.abs(), head.abs().t()).max().item<double>();
    const double h = static_cast<double>(head.size(1)), gamma = h * 0x1p-24 / (1 - h * 0x1p-24);
    EXPECT_LE(test::max_abs_diff(logits, headed.forward(ids)), 2 * gamma * scale) << name;
    EXPECT_FALSE(head.requires_grad());
    for (const std::string& loaded : headless.loaded_tensor_names()) EXPECT_NE(loaded, "lm_head.weight") << name;
  }
}

TEST(TeacherStage, MissingHeadIsNamedForTheHiddenChannel) {
  // An untied config whose checkpoint lost lm_head.weight: a student cannot make the logits.
  const std::string src = test::tiny_qwen3_fixtures() + "/untied_mha";
  const std::string dst = test::temp_dir("teacher_no_head");
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
  const SafetensorsFile file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const TensorInfo& info : file.tensors())
    if (info.name != "lm_head.weight") tensors.emplace_back(info.name, file_tensor(file, info).clone());
  write_tensors(dst + "/model.safetensors", tensors);
  try {
    load_teacher_head(dst, at::kFloat);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor lm_head.weight: missing"), std::string::npos) << e.what();
  }
}

TEST(TeacherStage, Bf16CheckpointLoadsIntoFp32) {
  const std::string dir = edited_checkpoint("teacher_bf16", [](auto& tensors) {
    for (auto& [name, t] : tensors) t = t.to(at::kBFloat16);
  });
  TeacherStage from_bf16(dir, 0, 2, true, true, at::kFloat);
  TeacherStage original(test::tiny_qwen3_fixtures() + "/tied_gqa", 0, 2, true, true, at::kFloat);
  const at::Tensor ids = at::randint(0, 97, {1, 8}, at::kLong);
  // bf16 weights are the fp32 ones rounded to 8 bits: close, not equal.
  const at::Tensor a = from_bf16.forward(ids), b = original.forward(ids);
  EXPECT_GT(test::max_abs_diff(a, b), 0.0);
  EXPECT_LT(test::max_abs_diff(a, b), 0.2 * b.abs().max().item<double>());
}

TEST(TeacherStage, RangeInconsistentWithRoleIsRejected) {
  const std::string dir = test::tiny_qwen3_fixtures() + "/tied_gqa";
  EXPECT_THROW(TeacherStage(dir, 1, 2, true, true, at::kFloat), InputError);   // embedding off layer 0
  EXPECT_THROW(TeacherStage(dir, 0, 1, true, true, at::kFloat), InputError);   // head before the end
  EXPECT_THROW(TeacherStage(dir, 0, 3, true, true, at::kFloat), InputError);   // past num_hidden_layers
}

}  // namespace
}  // namespace deepen
