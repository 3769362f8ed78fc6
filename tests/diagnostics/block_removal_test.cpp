// Block removal: bypassing a block equals the student without it, an identity block costs nothing,
// padding never counts, and transformers on the exported student gives the same ΔCE and angles.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "diagnostics/block_removal.h"
#include "model/student_io.h"
#include "tests/model/order_one_weights.h"
#include "tests/model/qwen3_fixtures.h"

namespace deepen {
namespace {

StudentSpec tiny_spec(NormPlacement norm, int64_t max_depth) {
  StudentSpec spec;
  spec.decoder = DecoderSpec{.hidden = 32, .heads = 4, .kv_heads = 2, .head_dim = 8, .intermediate = 64,
                             .rope_theta = 10000.0, .rms_eps = 1e-6};
  spec.vocab_size = 53;
  spec.max_depth = max_depth;
  spec.norm = norm;
  spec.tie_embeddings = false;
  return spec;
}

// Two rows of 12 positions; row 1 is right-padded after 7 (label −1, arbitrary ids).
std::pair<at::Tensor, at::Tensor> padded_batch(int64_t pad_id) {
  torch::manual_seed(5);
  at::Tensor ids = torch::randint(0, 53, {2, 13}, torch::kLong);
  ids.index_put_({1, torch::indexing::Slice(8, 13)}, pad_id);
  at::Tensor inputs = ids.narrow(1, 0, 12).clone(), labels = ids.narrow(1, 1, 12).clone();
  labels.index_put_({1, torch::indexing::Slice(7, 12)}, -1);
  return {inputs, labels};
}

// Student `without` = `s` minus layers [first, first + n): same embedding, norms and head.
std::shared_ptr<GrowableStudent> without_layers(const GrowableStudent& s, int64_t first, int64_t n) {
  auto out = std::make_shared<GrowableStudent>(s.spec(), s.depth() - n, 1);
  at::NoGradGuard no_grad;
  auto mine = s.named_parameters();
  for (auto& item : out->named_parameters()) {
    std::string name = item.key();
    if (name.rfind("layers.", 0) == 0) {
      const size_t dot = name.find('.', 7);
      const int64_t i = std::stoll(name.substr(7, dot - 7));
      name = "layers." + std::to_string(i < first ? i : i + n) + name.substr(dot);
    }
    item.value().copy_(*mine.find(name));
  }
  return out;
}

TEST(BlockRemoval, BypassingABlockEqualsTheStudentWithoutIt) {
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost}) {
    for (int64_t L : {1, 2}) {
      at::manual_seed(17);
      GrowableStudent s(tiny_spec(norm, 4), 4, 9);
      test::give_order_one_activations(s);
      const auto [inputs, labels] = padded_batch(0);
      const BlockRemovalResult r = block_removal(s, inputs, labels, L);
      ASSERT_EQ(static_cast<int64_t>(r.blocks.size()), 4 / L);
      EXPECT_EQ(r.tokens, 12 + 7);
      const at::Tensor real = labels != -1;
      const auto ce = [&](GrowableStudent& m) {
        const at::Tensor logits = m.forward(inputs).to(at::kDouble).reshape({-1, 53});
        return at::cross_entropy_loss(logits, labels.reshape({-1}), {}, at::Reduction::Mean, -1).item<double>();
      };
      // fp32 logits of O(10) from the same weights by a full and a chunked matmul differ by a
      // few ulps (~1e-6); log-softmax keeps that size, so the mean CE agrees to 1e-5.
      EXPECT_NEAR(r.full_ce, ce(s), 1e-5);
      // The stream, computed here block by block.
      std::vector<at::Tensor> stream = {s.embed(inputs)};
      for (int64_t i = 0; i < 4; ++i) stream.push_back(s.apply_block(i, stream.back()));
      for (int64_t b = 0; b < 4 / L; ++b) {
        const auto shorter = without_layers(s, b * L, L);
        EXPECT_NEAR(r.blocks[b].ce_without, ce(*shorter), 1e-5) << "block " << b << " L " << L;
        EXPECT_NEAR(r.blocks[b].delta_ce, ce(*shorter) - ce(s), 2e-5);
        EXPECT_GT(std::abs(r.blocks[b].delta_ce), 1e-3);  // the blocks do matter
        const at::Tensor cos = at::cosine_similarity(stream[b * L], stream[(b + 1) * L], -1);
        const double angle = (at::acos(cos.clamp(-1, 1)) / M_PI).index({real}).mean().item<double>();
        // fp32 cosine: ~1e-7 relative; acos' slope 1/sin stays below 10 at these angles.
        EXPECT_NEAR(r.blocks[b].angle, angle, 1e-5) << "block " << b;
      }
    }
  }
}

TEST(BlockRemoval, AnIdentityBlockCostsNothingAndKeepsDirections) {
  at::manual_seed(2);
  GrowableStudent s(tiny_spec(NormPlacement::kPre, 2), 1, 4);
  test::give_order_one_activations(s);
  s.append(1, GrowInit::kIdentity);  // o_proj and down_proj 0: the block adds exactly 0
  const auto [inputs, labels] = padded_batch(0);
  const BlockRemovalResult r = block_removal(s, inputs, labels, 1);
  EXPECT_EQ(r.blocks[1].delta_ce, 0.0);
  // cos(x, x) in double is 1 within ~1e-15, and arccos(1 − δ) = sqrt(2δ) ≈ 5e-8.
  EXPECT_NEAR(r.blocks[1].angle, 0.0, 1e-7);
  EXPECT_GT(std::abs(r.blocks[0].delta_ce), 0.1);  // a random block matters (either way)
}

TEST(BlockRemoval, PaddingNeverCounts) {
  at::manual_seed(4);
  GrowableStudent s(tiny_spec(NormPlacement::kPost, 2), 2, 4);
  test::give_order_one_activations(s);
  const auto [a_in, a_lab] = padded_batch(0);
  const auto [b_in, b_lab] = padded_batch(41);  // other ids in the padding
  const BlockRemovalResult a = block_removal(s, a_in, a_lab, 1), b = block_removal(s, b_in, b_lab, 1);
  EXPECT_EQ(a.full_ce, b.full_ce);
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    EXPECT_EQ(a.blocks[i].delta_ce, b.blocks[i].delta_ce);
    EXPECT_EQ(a.blocks[i].angle, b.blocks[i].angle);
  }
  EXPECT_THROW(block_removal(s, a_in, torch::full_like(a_lab, -1), 1), std::invalid_argument);
  EXPECT_THROW(block_removal(s, a_in, a_lab, 3), std::invalid_argument);
}

// Independent computation: `deepen export`'s writer, then transformers' Qwen3 with layers taken
// out of model.model.layers (tests/hf_reference/block_removal.py).
TEST(BlockRemoval, TransformersOnTheExportedStudentAgrees) {
  at::manual_seed(23);
  GrowableStudent s(tiny_spec(NormPlacement::kPre, 4), 4, 6);
  test::give_order_one_activations(s);
  const std::string tmp = test::temp_dir("block_removal_hf");
  export_student_hf(s, tmp + "/hf");
  const auto [inputs, labels] = padded_batch(0);
  {
    std::ofstream out(tmp + "/batch.txt");
    for (const at::Tensor* t : {&inputs, &labels})
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t i = 0; i < 12; ++i) out << (*t)[b][i].item<int64_t>() << " ";
        out << "\n";
      }
  }
  const BlockRemovalResult r = block_removal(s, inputs, labels, 2);
  const auto run = test::run_command(std::string(test::kPython) + " " + test::hf_reference_script("block_removal.py") +
                                     " --model " + tmp + "/hf --batch " + tmp + "/batch.txt --block-layers 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json hf = nlohmann::json::parse(run.output.substr(run.output.rfind('{', run.output.find("\"full_ce\""))));
  EXPECT_EQ(hf["tokens"].get<int64_t>(), r.tokens);
  // Export_test bounds transformers' fp32 logits against ours by 1e-4 (another attention kernel,
  // another summation order); a CE moves by at most twice the largest logit change: 2e-4.
  EXPECT_NEAR(hf["full_ce"].get<double>(), r.full_ce, 2e-4);
  ASSERT_EQ(hf["blocks"].size(), 2u);
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_NEAR(hf["blocks"][b]["ce_without"].get<double>(), r.blocks[b].ce_without, 2e-4) << "block " << b;
    EXPECT_NEAR(hf["blocks"][b]["delta_ce"].get<double>(), r.blocks[b].delta_ce, 4e-4) << "block " << b;
    // Hidden states agree to ~1e-6 relative; an angle moves by that over sin(angle) (> 0.1 here).
    EXPECT_NEAR(hf["blocks"][b]["angle"].get<double>(), r.blocks[b].angle, 1e-4) << "block " << b;
    EXPECT_GT(std::abs(r.blocks[b].delta_ce), 0.01);  // random blocks matter (either way)
  }
}

}  // namespace
}  // namespace deepen
