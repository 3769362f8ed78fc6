// student.precision = "bf16-mixed": bf16 compute on fp32 master weights, checked against the pure-bf16
// student (same bf16 arithmetic, bit for bit) and through deepen's AdamW (masters keep small updates).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "model/student.h"
#include "train/adamw.h"

namespace deepen {
namespace {

// Untied, so every parameter has exactly one use in the forward (see GradientsAreThePureOnesInFp32).
StudentSpec spec_in(at::ScalarType params, at::ScalarType compute) {
  StudentSpec spec;
  spec.decoder = DecoderSpec{.hidden = 32, .heads = 4, .kv_heads = 2, .head_dim = 16, .intermediate = 64,
                             .rope_theta = 10000.0, .rms_eps = 1e-6};
  spec.decoder.compute_dtype = compute;
  spec.vocab_size = 50;
  spec.max_depth = 3;
  spec.norm = NormPlacement::kPre;
  spec.tie_embeddings = false;
  spec.dtype = params;
  return spec;
}
StudentSpec mixed_spec() { return spec_in(at::kFloat, at::kBFloat16); }
StudentSpec pure_spec() { return spec_in(at::kBFloat16, at::ScalarType::Undefined); }

at::Tensor some_ids() { return at::arange(0, 24, at::kLong).remainder(50).view({2, 12}); }

// Both students draw the same fp32 init; pure rounds it to bf16 once, mixed rounds it at each use.
// So the bf16 weights every op sees are the same, the ops are the same, and the logits must be
// identical bit for bit: any difference means mixed computes something pure does not.
TEST(MixedPrecision, ForwardIsThePureBf16ForwardOnTheRoundedMasters) {
  GrowableStudent mixed(mixed_spec(), 2, 5), pure(pure_spec(), 2, 5);
  for (const auto& [name, p] : mixed.named_trainable_parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
  const at::Tensor a = mixed.forward(some_ids()), b = pure.forward(some_ids());
  EXPECT_EQ(a.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(a, b));
}

// The bf16 copy's gradient reaches the fp32 master through the cast (a dtype conversion, exact), so
// with one use per parameter the master's gradient is the pure student's bf16 gradient, in fp32.
TEST(MixedPrecision, GradientsAreThePureOnesInFp32) {
  GrowableStudent mixed(mixed_spec(), 2, 5), pure(pure_spec(), 2, 5);
  for (GrowableStudent* s : {&mixed, &pure}) s->forward(some_ids()).to(at::kFloat).square().mean().backward();
  const auto pp = pure.named_trainable_parameters();
  const auto mp = mixed.named_trainable_parameters();
  ASSERT_EQ(pp.size(), mp.size());
  for (size_t i = 0; i < mp.size(); ++i) {
    ASSERT_TRUE(mp[i].second.grad().defined()) << mp[i].first;
    EXPECT_EQ(mp[i].second.grad().scalar_type(), at::kFloat) << mp[i].first;
    EXPECT_TRUE(at::equal(mp[i].second.grad(), pp[i].second.grad().to(at::kFloat))) << mp[i].first;
  }
}

// The reason for masters. A gain at 1.0 gets N AdamW steps of lr = 1e-3 with a constant gradient
// of -1: each update is lr * m_hat / (sqrt(v_hat) + eps) = +lr (m_hat = -1, v_hat = 1 exactly up to
// fp32 rounding). bf16 has 8 significant bits: above 1.0 its ulp is 2^-7 = 0.0078, so 1 + 0.001
// rounds back to 1 and the pure-bf16 weight never moves, however many steps. The fp32 master
// gains N * lr; its error is N * (lr * ~1e-6 relative error of the update + half an fp32 ulp of 1,
// 6e-8) < 1e-6 for N = 10, so 1e-5 bounds it with room. After 10 steps the master is 1.01 and the
// bf16 copy the forward uses is bf16(1.01) = 1.0078125: the small updates reached the model.
TEST(MixedPrecision, Fp32MastersKeepAdamWUpdatesThatPureBf16Loses) {
  constexpr int kSteps = 10;
  constexpr double kLr = 1e-3;
  GrowableStudent mixed(mixed_spec(), 1, 5), pure(pure_spec(), 1, 5);
  const at::Tensor pure_before = pure.forward(some_ids()), mixed_before = mixed.forward(some_ids());
  for (GrowableStudent* s : {&mixed, &pure}) {
    AdamW opt(AdamWOptions{.weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
    at::Tensor gain;
    for (const auto& [name, p] : s->named_trainable_parameters()) {
      opt.add(name, p);
      if (name == "norm.weight") gain = p;
    }
    ASSERT_TRUE(gain.defined());
    for (int i = 0; i < kSteps; ++i) {
      gain.mutable_grad() = at::full_like(gain, -1.0);  // only the gain has a gradient: only it steps
      opt.step(kLr);
      opt.zero_grad();
    }
    for (const auto& [key, state] : opt.state_tensors())
      if (key.find(".exp_avg") != std::string::npos)  // moments live in the parameters' dtype
        EXPECT_EQ(state.scalar_type(), s == &mixed ? at::kFloat : at::kBFloat16) << key;
  }
  const at::Tensor pure_gain = pure.named_parameters()["norm.weight"];
  const at::Tensor master = mixed.named_parameters()["norm.weight"];
  EXPECT_TRUE(at::equal(pure_gain, at::ones_like(pure_gain))) << "pure bf16 kept an update below half an ulp";
  EXPECT_TRUE(at::equal(pure.forward(some_ids()), pure_before));
  EXPECT_LT((master - (1.0 + kSteps * kLr)).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(at::equal(master.to(at::kBFloat16), at::full_like(master, 1.0078125, at::kBFloat16)));
  EXPECT_FALSE(at::equal(mixed.forward(some_ids()), mixed_before)) << "the bf16 view did not move";
}

}  // namespace
}  // namespace deepen
