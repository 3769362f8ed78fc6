// Qwen3 numerics against Hugging Face transformers: tiny random checkpoints (tied/untied, GQA 1 and
// >1, head_dim != hidden/heads, biases, sharded) give the same fp32 logits, in the library and
// through `deepen forward`; the aten path's RMSNorm and RoPE against transformers' op sequences.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include <torch/autograd.h>

#include "model/qwen3.h"
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

// The aten path writes RMSNorm's backward in closed form and RoPE's rotate_half as a roll; what
// transformers' modeling_qwen3.py writes is the reference, run through autograd here.
at::Tensor hf_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps));
}

at::Tensor hf_apply_rotary(const at::Tensor& x, const Rotary& rope) {
  const int64_t half = x.size(-1) / 2;
  return x * rope.cos + at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * rope.sin;
}

// Gradients of f(inputs) under upstream gradient g, with respect to leaf copies of the inputs.
std::vector<at::Tensor> grads_of(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                                 std::vector<at::Tensor> inputs, const at::Tensor& g) {
  for (at::Tensor& t : inputs) t = t.detach().requires_grad_();
  return torch::autograd::grad({f(inputs)}, inputs, {g});
}

TEST(Qwen3Ops, AtenRmsNormHasTransformersValuesAndGradientsWithinRounding) {
  at::manual_seed(3);
  // A [B, T, heads, d] view of a wider projection output, as the q/k norms read it, and a plain one.
  const at::Tensor wide = at::randn({2, 7, 48});
  for (const at::Tensor& x : {wide.narrow(-1, 16, 32).view({2, 7, 2, 16}), at::randn({2, 7, 32}) * 3}) {
    const at::Tensor w = 1 + 0.3 * at::randn({x.size(-1)});
    EXPECT_TRUE(at::equal(rms_norm(x, w, 1e-6, CpuKernels::kAten), hf_rms_norm(x, w, 1e-6)));
    const at::Tensor g = at::randn(x.sizes());
    const auto want = grads_of([](const auto& in) { return hf_rms_norm(in[0], in[1], 1e-6); }, {x, w}, g);
    const auto got = grads_of([](const auto& in) { return rms_norm(in[0], in[1], 1e-6, CpuKernels::kAten); }, {x, w}, g);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LT(max_abs_diff(got[i], want[i]) / want[i].abs().max().item<double>(), 1e-5) << (i ? "dw" : "dx");
  }
}

TEST(Qwen3Ops, RotaryIsTransformersRotateHalfBitForBitInValuesAndGradients) {
  at::manual_seed(4);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Rotary rope = make_rotary(9, 16, 10000.0, dtype, at::kCPU);
    // [B, heads, T, d] in the transposed layout the projections produce.
    const at::Tensor x = at::randn({2, 9, 3, 16}).to(dtype).transpose(1, 2);
    EXPECT_TRUE(at::equal(apply_rotary(x, rope), hf_apply_rotary(x, rope))) << dtype;
    const at::Tensor g = at::randn(x.sizes()).to(dtype);
    const auto want = grads_of([&](const auto& in) { return hf_apply_rotary(in[0], rope); }, {x}, g);
    const auto got = grads_of([&](const auto& in) { return apply_rotary(in[0], rope); }, {x}, g);
    EXPECT_TRUE(at::equal(got[0], want[0])) << dtype;
  }
}

}  // namespace
}  // namespace deepen
