// Block-boundary RMS: token types, boundary selection, and summaries against direct formulas.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>

#include "diagnostics/block_boundary_rms.h"

namespace deepen {
namespace {

constexpr int64_t kPad = static_cast<int64_t>(TokenType::kPadding);
constexpr int64_t kReg = static_cast<int64_t>(TokenType::kRegular);
constexpr int64_t kDoc = static_cast<int64_t>(TokenType::kDocumentBoundary);

TEST(BlockBoundaryRms, TokenTypesFollowTheHeaderExample) {
  const at::Tensor inputs = torch::tensor({{5, 6, 0, 7, 8}, {9, 1, 2, 3, 3}}, torch::kLong);
  const at::Tensor labels = torch::tensor({{6, 0, 7, 8, -1}, {1, 2, 3, -1, -1}}, torch::kLong);
  const at::Tensor types = token_types(inputs, labels, 0);
  const at::Tensor want = torch::tensor({{kDoc, kReg, kDoc, kDoc, kPad}, {kDoc, kReg, kReg, kPad, kPad}}, torch::kLong);
  EXPECT_TRUE(types.equal(want)) << types;
  EXPECT_THROW(token_types(inputs, labels.narrow(1, 0, 4), 0), std::invalid_argument);
}

TEST(BlockBoundaryRms, BoundariesAreEveryLthEntryOfTheStream) {
  std::vector<at::Tensor> stream;
  for (int i = 0; i <= 6; ++i) stream.push_back(torch::full({1, 1, 1}, static_cast<float>(i)));
  const std::vector<at::Tensor> b = block_boundaries(stream, 3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].item<float>(), 0.f);
  EXPECT_EQ(b[1].item<float>(), 3.f);
  EXPECT_EQ(b[2].item<float>(), 6.f);
  EXPECT_EQ(block_boundaries(stream, 1).size(), 7u);
  EXPECT_THROW(block_boundaries(stream, 4), std::invalid_argument);  // 6 layers are not blocks of 4
}

// Token t of [1, T, H] has every entry equal to v[t]: its RMS is |v[t]|.
at::Tensor constant_tokens(const std::vector<double>& v, int64_t h) {
  return torch::tensor(v, torch::kDouble).view({1, -1, 1}).expand({1, static_cast<int64_t>(v.size()), h}).contiguous();
}

TEST(BlockBoundaryRms, SummariesPerTypeLeavePaddingOut) {
  // RMS per token: boundary 10, regular 1, 2, 3, padding 1000 (must not appear anywhere).
  const at::Tensor x = constant_tokens({10, 1, -2, 3, 1000}, 4);
  const at::Tensor types = torch::tensor({{kDoc, kReg, kReg, kReg, kPad}}, torch::kLong);
  const std::vector<BoundaryRms> r = block_boundary_rms({x, 2 * x}, types);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].all.count, 4);
  EXPECT_DOUBLE_EQ(*r[0].all.mean, 4.0);
  EXPECT_EQ(r[0].document_boundary.count, 1);
  EXPECT_DOUBLE_EQ(*r[0].document_boundary.mean, 10.0);
  EXPECT_EQ(r[0].regular.count, 3);
  EXPECT_DOUBLE_EQ(*r[0].regular.mean, 2.0);
  EXPECT_DOUBLE_EQ(*r[0].regular.std, std::sqrt(2.0 / 3.0));
  EXPECT_DOUBLE_EQ(*r[1].regular.mean, 4.0);
  // all = {10, 1, 2, 3}: mean 4, m2 = (36 + 9 + 4 + 1) / 4 = 12.5, m4 = (1296 + 81 + 16 + 1) / 4 = 348.5.
  EXPECT_DOUBLE_EQ(*r[0].all.kurtosis, 348.5 / (12.5 * 12.5));
  const nlohmann::json j = to_json(r[0]);
  EXPECT_EQ(j["document_boundary"]["count"], 1);
  EXPECT_TRUE(j["document_boundary"]["kurtosis"].is_null());  // one token: no spread
}

// Per-token RMS and kurtosis from a plain loop over a random stream with a few massive tokens.
TEST(BlockBoundaryRms, KurtosisMatchesADirectFormulaOnARandomStream) {
  torch::manual_seed(3);
  at::Tensor x = torch::randn({2, 64, 32}, torch::kFloat);
  x[0][0].mul_(300);  // a massive first token, as pre-norm streams have
  x[1][0].mul_(200);
  const at::Tensor labels = torch::ones({2, 64}, torch::kLong);
  const at::Tensor types = token_types(torch::ones({2, 64}, torch::kLong), labels, /*eos=*/0);
  const BoundaryRms r = block_boundary_rms({x}, types)[0];
  std::vector<double> rms;
  const at::Tensor xd = x.to(torch::kDouble);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 64; ++t) {
      double s = 0;
      for (int h = 0; h < 32; ++h) s += xd[b][t][h].item<double>() * xd[b][t][h].item<double>();
      rms.push_back(std::sqrt(s / 32));
    }
  double mean = 0;
  for (double v : rms) mean += v;
  mean /= 128;
  double m2 = 0, m4 = 0;
  for (double v : rms) m2 += std::pow(v - mean, 2) / 128, m4 += std::pow(v - mean, 4) / 128;
  // The same double arithmetic in a different order: agreement to ~1e-13 relative.
  EXPECT_NEAR(*r.all.mean, mean, 1e-12 * mean);
  EXPECT_NEAR(*r.all.kurtosis, m4 / (m2 * m2), 1e-11 * m4 / (m2 * m2));
  EXPECT_GT(*r.all.kurtosis, 20.0);
  EXPECT_GT(*r.document_boundary.mean, 100 * *r.regular.mean);
  EXPECT_EQ(r.document_boundary.count, 2);
  EXPECT_EQ(values_of_type(per_token_rms(x), types, TokenType::kRegular).size(), 126u);
}

}  // namespace
}  // namespace deepen
