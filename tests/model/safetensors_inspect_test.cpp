// `deepen inspect`: what a user sees for a good checkpoint, and exit code 2 with the reason for a bad one.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "output: " << (text)

struct CommandResult {
  int rc;
  std::string out;  // stdout and stderr together
};

CommandResult deepen_inspect(const std::string& path) {
  const char* env = std::getenv("DEEPEN_BIN");
  const std::string bin = env ? env : test::kDeepenBin;
  const std::string log = path + ".inspect.log";
  const int rc = std::system((bin + " inspect '" + path + "' > '" + log + "' 2>&1").c_str());
  std::ifstream in(log);
  std::stringstream s;
  s << in.rdbuf();
  fs::remove(log);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, s.str()};
}

class Inspect : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deepen-inspect-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_.vocab_size = 16; config_.hidden_size = 8; config_.intermediate_size = 12; config_.num_hidden_layers = 2;
    config_.num_attention_heads = 2; config_.num_key_value_heads = 1; config_.head_dim = 4;
    config_.tie_word_embeddings = true; config_.torch_dtype = "bfloat16";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A complete BF16 checkpoint for config_ (zeros), optionally with one tensor replaced or dropped.
  void write_checkpoint(const std::string& change = "", std::vector<int64_t> shape = {}) {
    write_qwen3_config(config_, (dir_ / "config.json").string());
    std::vector<std::vector<std::byte>> storage;
    std::vector<TensorToWrite> tensors;
    const auto expected = expected_all_tensors(config_);
    storage.reserve(expected.size());
    for (const auto& e : expected) {
      std::vector<int64_t> s = e.name == change ? shape : e.shape;
      if (e.name == change && s.empty()) continue;  // drop it
      int64_t n = 1;
      for (auto d : s) n *= d;
      storage.emplace_back(static_cast<size_t>(n) * 2);
      tensors.push_back({e.name, DType::BF16, s, storage.back()});
    }
    write_safetensors((dir_ / "model.safetensors").string(), tensors, {{"format", "pt"}});
  }
  fs::path dir_;
  Qwen3Config config_;
};

TEST_F(Inspect, ListsTensorsAndConfirmsTheConfig) {
  write_checkpoint();
  const CommandResult r = deepen_inspect(dir_.string());
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_HAS(r.out, "model.layers.1.mlp.down_proj.weight");
  EXPECT_HAS(r.out, "BF16");
  EXPECT_HAS(r.out, "[8, 12]");
  EXPECT_HAS(r.out, dir_.string() + ": 24 tensors, ");
  EXPECT_HAS(r.out, "metadata format = pt");
  EXPECT_HAS(r.out, "qwen3, 2 layers, hidden 8, intermediate 12, heads 2 (kv 1), head_dim 4, vocab 16, tied head");
  EXPECT_HAS(r.out, "all 24 tensors the config implies are present with the right shapes");
}

TEST_F(Inspect, ShapeMismatchWithConfigExitsTwo) {
  write_checkpoint("model.layers.1.mlp.up_proj.weight", {8, 8});
  const CommandResult r = deepen_inspect(dir_.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, (dir_ / "model.safetensors").string() +
                        ": tensor model.layers.1.mlp.up_proj.weight: shape [8, 8], config says [12, 8]");
}

TEST_F(Inspect, MissingTensorExitsTwo) {
  write_checkpoint("model.layers.0.self_attn.q_norm.weight");
  const CommandResult r = deepen_inspect(dir_.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "tensor model.layers.0.self_attn.q_norm.weight: missing");
}

TEST_F(Inspect, MalformedConfigExitsTwo) {
  write_checkpoint();
  std::ofstream(dir_ / "config.json") << "{\"model_type\": \"qwen3\",";
  const CommandResult r = deepen_inspect(dir_.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, (dir_ / "config.json").string() + ": malformed JSON");
}

TEST_F(Inspect, TruncatedFileExitsTwo) {
  write_checkpoint();
  const fs::path file = dir_ / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1);
  const CommandResult r = deepen_inspect(file.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "deepen: error: " + file.string() + ": tensor ");
  EXPECT_HAS(r.out, "(truncated file or corrupt header)");
}

TEST_F(Inspect, HeaderLengthPastEndExitsTwo) {
  const fs::path file = dir_ / "x.safetensors";
  std::ofstream out(file, std::ios::binary);
  const uint64_t n = 1 << 20;
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << "{}";
  out.close();
  const CommandResult r = deepen_inspect(file.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "header length 1048576 runs past the end of the file (10 bytes)");
}

TEST_F(Inspect, OverlappingOffsetsExitTwo) {
  const fs::path file = dir_ / "x.safetensors";
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  std::ofstream out(file, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(24, '\0');
  out.close();
  const CommandResult r = deepen_inspect(file.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "tensors a [0, 16] and b [8, 24] overlap");
}

TEST_F(Inspect, FolderWithoutCheckpointExitsTwo) {
  const CommandResult r = deepen_inspect(dir_.string());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "not a safetensors checkpoint");
}

}  // namespace
}  // namespace deepen
