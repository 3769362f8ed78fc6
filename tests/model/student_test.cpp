// GrowableStudent: equals HF Qwen3 with the same weights (pre-norm); growth operators, freezing,
// checksums, the diagnostics hooks and the post-norm placement behave as documented.
#include <gtest/gtest.h>

#include <set>

#include <ATen/ATen.h>

#include "config/config.h"
#include "config/input_error.h"
#include "model/student.h"
#include "model/student_io.h"
#include "tests/model/qwen3_fixtures.h"

namespace deepen {
namespace {

StudentSpec small_spec(NormPlacement norm, bool tied = true) {
  StudentSpec spec;
  spec.decoder = DecoderSpec{.hidden = 32, .heads = 4, .kv_heads = 2, .head_dim = 16, .intermediate = 64,
                             .rope_theta = 10000.0, .rms_eps = 1e-6};
  spec.vocab_size = 50;
  spec.max_depth = 4;
  spec.norm = norm;
  spec.tie_embeddings = tied;
  return spec;
}

at::Tensor some_ids() { return at::arange(0, 24, at::kLong).remainder(50).view({2, 12}); }

TEST(Student, PreNormWithAllBlocksEqualsTransformersQwen3WithTheSameWeights) {
  for (const std::string& name : test::tiny_qwen3_cases()) {
    const std::string dir = test::tiny_qwen3_fixtures() + "/" + name;
    const auto student = load_student_hf(dir);
    EXPECT_EQ(student->spec().norm, NormPlacement::kPre);
    const auto ids = test::read_ids(dir + "/ids.txt");
    const auto reference = test::read_logits(dir + "/reference.safetensors");
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_LT(test::max_abs_diff(student->forward(ids[i])[0], reference[i]), 1e-4) << name;
  }
}

TEST(Student, SpecFromConfigTakesTheStudentSection) {
  StudentConfig cfg;
  cfg.layers = 9; cfg.hidden = 64; cfg.heads = 4; cfg.kv_heads = 2; cfg.head_dim = 32;
  cfg.intermediate = 128; cfg.norm = NormPlacement::kPost; cfg.tie_embeddings = false; cfg.precision = StudentPrecision::kBf16Pure;
  const StudentSpec spec = student_spec_from_config(cfg, 256);
  EXPECT_EQ(spec.max_depth, 9);
  EXPECT_EQ(spec.decoder.head_dim, 32);
  EXPECT_EQ(spec.norm, NormPlacement::kPost);
  EXPECT_EQ(spec.dtype, at::kBFloat16);
  EXPECT_EQ(spec.compute(), at::kBFloat16);
  cfg.precision = StudentPrecision::kBf16Mixed;  // fp32 parameters (the optimizer's masters), bf16 compute
  EXPECT_EQ(student_spec_from_config(cfg, 256).dtype, at::kFloat);
  EXPECT_EQ(student_spec_from_config(cfg, 256).compute(), at::kBFloat16);
  cfg.precision = StudentPrecision::kFp32;
  EXPECT_EQ(student_spec_from_config(cfg, 256).compute(), at::kFloat);
  EXPECT_THROW(parse_config("[student]\nnorm = \"middle\"\n", "x.toml"), InputError);
  cfg.norm = NormPlacement::kPre; cfg.kv_heads = 3;
  EXPECT_THROW(student_spec_from_config(cfg, 256), InputError);
}

TEST(Student, IdentityGrowthLeavesThePreNormFunctionUnchanged) {
  GrowableStudent s(small_spec(NormPlacement::kPre), 2, 7);
  const at::Tensor before = s.forward(some_ids());
  s.append(2, GrowInit::kIdentity);
  EXPECT_EQ(s.depth(), 4);
  EXPECT_TRUE(at::equal(s.forward(some_ids()), before));
  // The new blocks are not inert: their other weights are random, so training moves them.
  EXPECT_GT(s.block(3)->self_attn->q_proj->weight.abs().max().item<double>(), 0.0);
}

// A post-norm layer renormalizes its input even when both sub-layers add 0: identity growth is
// allowed, and changes the function by what norm(norm(x)) differs from x (measured in
// tests/model/growth_operator_test.cpp, per placement).
TEST(Student, IdentityGrowthOfAPostNormStudentRenormalizesItsInput) {
  GrowableStudent s(small_spec(NormPlacement::kPost), 1, 7);
  {
    at::NoGradGuard no_grad;
    s.block(0)->post_attention_layernorm->weight.mul_(1.5);  // as training moves the last gain off 1
  }
  const at::Tensor before = s.forward(some_ids());
  s.append(1, GrowInit::kIdentity);
  EXPECT_EQ(s.depth(), 2);
  EXPECT_FALSE(at::allclose(s.forward(some_ids()), before, 1e-3, 1e-3));
}

TEST(Student, StackCopiesTheLastActiveBlock) {
  GrowableStudent s(small_spec(NormPlacement::kPost), 2, 7);
  s.append(2, GrowInit::kStack);  // one-layer blocks: both new layers copy layer 1
  const auto last = s.block(1)->named_parameters();
  for (int64_t i : {2, 3})
    for (const auto& item : s.block(i)->named_parameters()) {
      EXPECT_TRUE(at::equal(item.value(), last[item.key()])) << i << " " << item.key();
      EXPECT_NE(item.value().data_ptr(), last[item.key()].data_ptr());  // a copy, not shared storage
    }
  EXPECT_FALSE(at::equal(s.block(0)->mlp->up_proj->weight, s.block(1)->mlp->up_proj->weight));
}

TEST(Student, RandomBlocksDependOnlyOnSeedAndIndex) {
  GrowableStudent grown(small_spec(NormPlacement::kPre), 1, 42);
  grown.append(1, GrowInit::kRandom);
  grown.append(2, GrowInit::kRandom);
  GrowableStudent direct(small_spec(NormPlacement::kPre), 4, 42);
  EXPECT_EQ(grown.parameter_checksum(), direct.parameter_checksum());
  GrowableStudent other_seed(small_spec(NormPlacement::kPre), 4, 43);
  EXPECT_NE(other_seed.parameter_checksum(), direct.parameter_checksum());
  // HF init: weights ~ N(0, 0.02), norms 1.
  const double std = direct.block(2)->mlp->down_proj->weight.std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.002);
  EXPECT_TRUE(at::equal(direct.block(2)->input_layernorm->weight, at::ones({32})));
}

TEST(Student, ChecksumChangesWhenAnyParameterChanges) {
  GrowableStudent s(small_spec(NormPlacement::kPre, /*tied=*/false), 3, 1);
  const uint64_t base = s.parameter_checksum();
  EXPECT_EQ(base, s.parameter_checksum());
  for (auto& item : s.named_parameters()) {
    at::NoGradGuard no_grad;
    const float old = item.value().view(-1)[0].item<float>();
    item.value().view(-1)[0] = old + 1e-3f;
    EXPECT_NE(s.parameter_checksum(), base) << item.key();
    item.value().view(-1)[0] = old;
  }
  EXPECT_EQ(s.parameter_checksum(), base);
}

TEST(Student, FreezePrefixTrainsOnlyTheBlocksAfterIt) {
  GrowableStudent s(small_spec(NormPlacement::kPre, /*tied=*/false), 2, 3);
  s.freeze_prefix(2);
  s.append(1, GrowInit::kRandom);
  for (const auto& [name, p] : s.named_trainable_parameters()) EXPECT_EQ(name.rfind("layers.2.", 0), 0u) << name;
  EXPECT_EQ(s.named_trainable_parameters().size(), s.block(2)->parameters().size());
  s.forward(some_ids()).pow(2).mean().backward();
  EXPECT_FALSE(s.block(0)->mlp->up_proj->weight.grad().defined());
  EXPECT_FALSE(s.head_weight().grad().defined());
  EXPECT_TRUE(s.block(2)->mlp->up_proj->weight.grad().defined());
  s.unfreeze_all();
  EXPECT_EQ(s.named_trainable_parameters().size(), s.parameters().size());
}

TEST(Student, ResidualStreamAndApplyBlockRebuildTheForwardPass) {
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost}) {
    GrowableStudent s(small_spec(norm), 3, 5);
    const at::Tensor ids = some_ids();
    const auto stream = s.residual_stream(ids);
    ASSERT_EQ(stream.size(), 4u);
    EXPECT_TRUE(at::equal(stream[0], s.embed(ids)));
    for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(s.apply_block(i, stream[i]), stream[i + 1]));
    EXPECT_TRUE(at::allclose(s.head_input(stream.back()), s.forward_hidden(ids)));
    EXPECT_TRUE(at::allclose(at::linear(s.forward_hidden(ids), s.head_weight()), s.forward(ids)));
  }
}

TEST(Student, PostNormHasNoFinalNormAndItsOutputIsNormalized) {
  GrowableStudent s(small_spec(NormPlacement::kPost), 2, 5);
  for (const auto& item : s.named_parameters()) EXPECT_NE(item.key(), "norm.weight");
  const at::Tensor out = s.residual_stream(some_ids()).back();
  EXPECT_TRUE(at::equal(s.head_input(out), out));
  // Unit gains at init: the last block's output has RMS 1 per token.
  const at::Tensor rms = out.pow(2).mean(-1).sqrt();
  EXPECT_LT((rms - 1).abs().max().item<double>(), 1e-3);
  GrowableStudent pre(small_spec(NormPlacement::kPre), 2, 5);
  bool has_norm = false;
  for (const auto& item : pre.named_parameters()) has_norm |= item.key() == "norm.weight";
  EXPECT_TRUE(has_norm);
}

TEST(Student, PostNormBlockMatchesItsFormula) {
  GrowableStudent s(small_spec(NormPlacement::kPost), 1, 9);
  const at::Tensor x = at::randn({2, 12, 32});
  DecoderBlock b = s.block(0);
  const Rotary rope = make_rotary(12, 16, 10000.0, at::kFloat, at::kCPU);
  const at::Tensor h = b->input_layernorm(x + b->self_attn(x, rope));
  const at::Tensor y = b->post_attention_layernorm(h + b->mlp(h));
  EXPECT_TRUE(at::allclose(s.apply_block(0, x), y));
}

TEST(Student, GrowingPastMaxDepthIsRejected) {
  GrowableStudent s(small_spec(NormPlacement::kPre), 3, 1);
  EXPECT_THROW(s.append(2, GrowInit::kRandom), InputError);
  EXPECT_THROW(GrowableStudent(small_spec(NormPlacement::kPre), 5, 1), InputError);
}

TEST(Student, Bf16StudentRunsInBf16) {
  StudentSpec spec = small_spec(NormPlacement::kPre);
  spec.dtype = at::kBFloat16;
  GrowableStudent s(spec, 2, 1);
  const at::Tensor logits = s.forward(some_ids());
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  GrowableStudent f32(small_spec(NormPlacement::kPre), 2, 1);
  EXPECT_LT(test::max_abs_diff(logits, f32.forward(some_ids())), 0.05);
}

}  // namespace
}  // namespace deepen

namespace deepen {
namespace {

// The fused fp32 CPU path (one [q|k|v] and one [gate|up] matmul, hand-fused RMSNorm, QK-norm +
// RoPE and SwiGLU kernels) against the op-by-op HF sequence: same values and same gradients; and
// "auto" (each step whichever of the two measured faster) within the same bounds.
TEST(Student, FusedCpuKernelsMatchTheOpSequenceInValuesAndGradients) {
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost}) {
    for (bool bias : {false, true}) {
      for (CpuKernels mode : {CpuKernels::kFused, CpuKernels::kAuto}) {
        StudentSpec spec = small_spec(norm, /*tied=*/false);
        spec.decoder.attention_bias = bias;
        spec.decoder.cpu_kernels = mode;
        GrowableStudent fused(spec, 3, 21);
        spec.decoder.cpu_kernels = CpuKernels::kAten;
        GrowableStudent plain(spec, 3, 21);
        ASSERT_EQ(fused.parameter_checksum(), plain.parameter_checksum());
        for (auto* s : {&fused, &plain}) {  // O(1) weights so differences would show
          at::manual_seed(5);
          at::NoGradGuard no_grad;
          for (auto& p : s->parameters()) p.copy_(p.dim() == 1 ? 1 + 0.3 * at::randn_like(p) : at::randn_like(p) / std::sqrt(double(p.size(-1))));
        }
        const at::Tensor ids = some_ids();
        const at::Tensor a = fused.forward(ids), b = plain.forward(ids);
        EXPECT_LT(test::max_abs_diff(a, b), 2e-5) << option_name(norm) << " bias " << bias
                                               << " " << option_name(mode);
        EXPECT_GT(b.abs().max().item<double>(), 1.0);
        const at::Tensor weights = at::randn_like(a);
        (a * weights).sum().backward();
        (b * weights).sum().backward();
        auto pf = fused.named_parameters(), pp = plain.named_parameters();
        for (const auto& item : pf) {
          const at::Tensor gf = item.value().grad(), gp = pp[item.key()].grad();
          ASSERT_TRUE(gf.defined() && gp.defined()) << item.key();
          const double scale = std::max(1.0, gp.abs().max().item<double>());
          EXPECT_LT(test::max_abs_diff(gf, gp) / scale, 1e-4) << item.key() << " " << option_name(mode);
        }
      }
    }
  }
  // auto measured each step once per shape class (this process may have measured more shapes).
  std::set<FusedStep> measured;
  for (const StepCalibration& c : process_cpu_kernel_calibration().measurements()) measured.insert(c.shape.step);
  EXPECT_EQ(measured, (std::set<FusedStep>{FusedStep::kRmsNorm, FusedStep::kQkvRope, FusedStep::kSwiGluMlp}));
}

}  // namespace
}  // namespace deepen
