// Qwen3 numerics against Hugging Face transformers: tiny random checkpoints (tied/untied, GQA 1 and
// >1, head_dim != hidden/heads, biases, sharded) give the same fp32 logits, in the library and
// through `deepen forward`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/teacher_stage.h"
#include "tests/model/qwen3_fixtures.h"

namespace deepen {
namespace {

using test::max_abs_diff;

class TinyQwen3 : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return test::tiny_qwen3_fixtures() + "/" + GetParam(); }
};

TEST_P(TinyQwen3, WholeModelLogitsMatchTransformersWithin1e4) {
  const auto ids = test::read_ids(dir() + "/ids.txt");
  const auto reference = test::read_logits(dir() + "/reference.safetensors");
  ASSERT_EQ(ids.size(), reference.size());
  const int layers = static_cast<int>(read_qwen3_config(dir() + "/config.json").num_hidden_layers);
  TeacherStage model(dir(), 0, layers, true, true, at::kFloat);
  for (size_t i = 0; i < ids.size(); ++i) {
    const at::Tensor logits = model.forward(ids[i])[0];
    ASSERT_EQ(logits.sizes(), reference[i].sizes());
    EXPECT_LT(max_abs_diff(logits, reference[i]), 1e-4) << GetParam() << " line " << i;
    // The bound is meaningful: logits are O(1), far above the tolerance.
    EXPECT_GT(reference[i].abs().max().item<double>(), 1.0);
  }
}

// bf16 is where the order of RMSNorm's cast and weight multiply (and RoPE's cos/sin cast) shows:
// deepen in bf16 must track transformers in bf16, far closer than either is to fp32.
TEST_P(TinyQwen3, Bf16LogitsMatchTransformersInBf16) {
  const auto ids = test::read_ids(dir() + "/ids.txt");
  const auto reference = test::read_logits(dir() + "/reference.safetensors");
  const auto reference_bf16 = test::read_logits(dir() + "/reference_bf16.safetensors");
  const int layers = static_cast<int>(read_qwen3_config(dir() + "/config.json").num_hidden_layers);
  TeacherStage model(dir(), 0, layers, true, true, at::kBFloat16);
  for (size_t i = 0; i < ids.size(); ++i) {
    const at::Tensor logits = model.forward(ids[i])[0];
    EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
    const double bf16_gap = max_abs_diff(reference_bf16[i], reference[i]);  // ~0.02-0.13 here
    EXPECT_GT(bf16_gap, 0.01);
    // Observed: bit-identical. Allow a tenth of the bf16-vs-fp32 gap for other CPUs' kernels.
    EXPECT_LE(max_abs_diff(logits, reference_bf16[i]), 0.1 * bf16_gap) << GetParam() << " line " << i;
  }
}

TEST_P(TinyQwen3, DeepenForwardWritesTheSameLogits) {
  const std::string out = test::temp_dir("forward_" + GetParam()) + "/logits.safetensors";
  const auto r = test::run_command(std::string(test::kDeepenBin) + " forward --model " + dir() +
                                   " --ids " + dir() + "/ids.txt --out " + out + " --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto logits = test::read_logits(out);
  const auto reference = test::read_logits(dir() + "/reference.safetensors");
  ASSERT_EQ(logits.size(), reference.size());
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_LT(max_abs_diff(logits[i], reference[i]), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TinyQwen3, ::testing::ValuesIn(test::tiny_qwen3_cases()));

TEST(DeepenForward, TokenIdPastTheVocabularyIsBadInputNamingTheLine) {
  const std::string model = test::tiny_qwen3_fixtures() + "/tied_gqa";
  const std::string tmp = test::temp_dir("forward_bad_id");
  std::ofstream(tmp + "/ids.txt") << "1 2 3\n4 97 5\n";  // vocab is 97
  const auto r = test::run_command(std::string(test::kDeepenBin) + " forward --model " + model +
                                   " --ids " + tmp + "/ids.txt --out " + tmp + "/out.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ids.txt:2: token id 97 outside the vocabulary [0, 97)"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp + "/out.safetensors"));
}

TEST(DeepenForward, NonIntegerTokenIsBadInput) {
  const std::string model = test::tiny_qwen3_fixtures() + "/tied_gqa";
  const std::string tmp = test::temp_dir("forward_word");
  std::ofstream(tmp + "/ids.txt") << "1 2 x3\n";
  const auto r = test::run_command(std::string(test::kDeepenBin) + " forward --model " + model +
                                   " --ids " + tmp + "/ids.txt --out " + tmp + "/out.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("\"x3\" is not an integer token id"), std::string::npos) << r.output;
}

TEST(DeepenForward, MissingModelFolderIsBadInput) {
  const std::string tmp = test::temp_dir("forward_missing");
  std::ofstream(tmp + "/ids.txt") << "1 2 3\n";
  const auto r = test::run_command(std::string(test::kDeepenBin) + " forward --model " + tmp +
                                   "/nope --ids " + tmp + "/ids.txt --out " + tmp + "/out.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(tmp + "/nope"), std::string::npos) << r.output;
}

TEST(DeepenForward, MissingIdsFileIsBadInput) {
  const std::string model = test::tiny_qwen3_fixtures() + "/tied_gqa";
  const std::string tmp = test::temp_dir("forward_no_ids");
  const auto r = test::run_command(std::string(test::kDeepenBin) + " forward --model " + model +
                                   " --ids " + tmp + "/absent.txt --out " + tmp + "/out.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("absent.txt: cannot open"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace deepen
