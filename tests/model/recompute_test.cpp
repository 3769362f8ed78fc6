// Activation recomputation: per layer or MLP only, the student's loss and every gradient are those
// without it, bit for bit, for both placements, with a frozen embedding feeding layer 0, and after
// growth; outside grad mode it is a plain call.
#include <gtest/gtest.h>

#include <string>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "config/input_error.h"
#include "model/recompute.h"
#include "model/student.h"
#include "tests/model/order_one_weights.h"

namespace deepen {
namespace {

StudentSpec spec_with(NormPlacement norm, Recompute recompute, bool frozen_embedding) {
  StudentSpec spec;
  spec.decoder = DecoderSpec{.hidden = 32, .heads = 4, .kv_heads = 2, .head_dim = 8, .intermediate = 96,
                             .rope_theta = 10000.0, .rms_eps = 1e-6, .cpu_kernels = CpuKernels::kAten};
  spec.decoder.recompute = recompute;
  spec.vocab_size = 61;
  spec.max_depth = 3;
  spec.norm = norm;
  spec.tie_embeddings = false;
  spec.entry_norm = norm == NormPlacement::kPost;
  spec.freeze_embedding = frozen_embedding;
  return spec;
}

// Loss and gradients of one forward + backward on a fixed batch; the weights come from the seed
// (redrawn at O(1) scale so that gradients are far from zero).
struct Step {
  double loss = 0;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};
Step one_step(const StudentSpec& spec, int64_t depth) {
  GrowableStudent s(spec, 1, 7);
  while (s.depth() < depth) s.append(1, GrowInit::kRandom);
  torch::manual_seed(11);
  test::give_order_one_activations(s);
  if (spec.freeze_embedding) s.named_parameters()["embed_tokens.weight"].requires_grad_(false);
  const at::Tensor ids = at::randint(0, 61, {2, 9}, at::kLong);
  const at::Tensor labels = at::randint(0, 61, {2, 9}, at::kLong);
  const at::Tensor logits = s.forward(ids);
  const at::Tensor loss = at::cross_entropy_loss(logits.view({-1, 61}), labels.view({-1}));
  loss.backward();
  Step out{loss.item<double>(), {}};
  for (const auto& p : s.named_parameters()) out.grads.emplace_back(p.key(), p.value().grad());
  return out;
}

TEST(Recompute, ParsesTheThreeModesAndNamesTheKey) {
  for (Recompute r : {Recompute::kNone, Recompute::kLayer, Recompute::kMlp})
    EXPECT_EQ(parse_option<Recompute>(option_name(r), "student.recompute"), r);
  try {
    parse_option<Recompute>("attention", "student.recompute");
    FAIL() << "accepted attention";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("student.recompute"), std::string::npos) << e.what();
  }
}

TEST(Recompute, LossAndEveryGradientEqualThoseWithoutIt) {
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost}) {
    for (bool frozen : {false, true}) {
      const Step plain = one_step(spec_with(norm, Recompute::kNone, frozen), 3);
      for (Recompute r : {Recompute::kLayer, Recompute::kMlp}) {
        const std::string what = std::string(option_name(norm)) + (frozen ? " frozen embedding " : " ") +
                                 option_name(r);
        const Step again = one_step(spec_with(norm, r, frozen), 3);
        EXPECT_EQ(again.loss, plain.loss) << what;
        ASSERT_EQ(again.grads.size(), plain.grads.size()) << what;
        for (size_t i = 0; i < plain.grads.size(); ++i) {
          const auto& [name, g] = plain.grads[i];
          ASSERT_EQ(again.grads[i].first, name);
          // A frozen embedding has no gradient either way; everything else has one, and the same.
          ASSERT_EQ(again.grads[i].second.defined(), g.defined()) << what << " " << name;
          if (!g.defined()) continue;
          EXPECT_GT(g.abs().max().item<double>(), 0.0) << what << " " << name;
          EXPECT_TRUE(at::equal(again.grads[i].second, g)) << what << " " << name;
        }
      }
    }
  }
}

TEST(Recompute, OutsideGradModeItIsAPlainCall) {
  const at::Tensor w = at::randn({4, 4}).requires_grad_(true);
  const at::Tensor x = at::randn({2, 4});
  at::NoGradGuard no_grad;
  int calls = 0;
  const at::Tensor y = recomputed([&](const at::Tensor& in) { ++calls; return at::matmul(in, w); }, x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(at::equal(y, at::matmul(x, w)));
}

}  // namespace
}  // namespace deepen
