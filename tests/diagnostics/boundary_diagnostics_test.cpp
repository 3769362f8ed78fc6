// Boundary diagnostics: residual RMS and identity-mapping per token class, on hand-computed inputs.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>

#include "diagnostics/boundary_diagnostics.h"

namespace deepen {
namespace {

// Classes of a 4-token sequence: first, special, structural, content.
at::Tensor one_of_each() { return torch::tensor({{0, 1, 2, 3}}, torch::kLong); }

// [1, T, H] where token t has every entry equal to values[t]: its RMS is |values[t]|.
at::Tensor constant_tokens(const std::vector<float>& values, int64_t h) {
  return torch::tensor(values).view({1, -1, 1}).expand({1, static_cast<int64_t>(values.size()), h}).contiguous();
}

TEST(BoundaryDiagnostics, TokenRmsIsTheRootMeanSquareOverHidden) {
  const at::Tensor x = torch::tensor({3.f, 4.f, 0.f, 0.f, 1.f, -1.f}).view({1, 3, 2});
  const at::Tensor rms = token_rms(x);
  ASSERT_EQ(rms.sizes(), (at::IntArrayRef{1, 3}));
  EXPECT_NEAR(rms[0][0].item<double>(), std::sqrt(12.5), 1e-6);
  EXPECT_EQ(rms[0][1].item<double>(), 0.0);
  EXPECT_NEAR(rms[0][2].item<double>(), 1.0, 1e-7);
}

TEST(BoundaryDiagnostics, ClassMeansFollowTheHeaderExample) {
  const ClassMeans m = class_means(torch::tensor({{1.0, 2.0, 3.0, 5.0}}), torch::tensor({{0, 3, 3, 1}}, torch::kLong));
  EXPECT_EQ(m.mean, (std::map<std::string, double>{{"all", 2.75}, {"content", 2.5}, {"first", 1.0}, {"special", 5.0}}));
  EXPECT_EQ(m.tokens, (std::map<std::string, int64_t>{{"all", 4}, {"content", 2}, {"first", 1}, {"special", 1}}));
  // No structural token: absent, not a 0 that would read as a measurement.
  EXPECT_EQ(m.mean.count("structural"), 0u);
}

TEST(BoundaryDiagnostics, ResidualScalePerBlockAndAtTheBoundary) {
  // Two sequences; token classes mixed; entering block 0 = x0, block 1 = x1 = 2·x0, boundary = 3·x0.
  const at::Tensor x0 = torch::cat({constant_tokens({1, 2, 3, 4}, 8), constant_tokens({5, -6, 7, 8}, 8)}, 0);
  const at::Tensor classes = torch::tensor({{0, 1, 2, 3}, {0, 3, 3, 2}}, torch::kLong);
  const ResidualScale r = residual_scale({x0, 2 * x0}, 3 * x0, classes);
  ASSERT_EQ(r.entering.size(), 2u);
  // first: tokens 1 and 5 -> 3; special: 2; structural: 3 and 8 -> 5.5; content: 4, 6, 7 -> 17/3.
  EXPECT_NEAR(r.entering[0].mean.at("first"), 3.0, 1e-6);
  EXPECT_NEAR(r.entering[0].mean.at("special"), 2.0, 1e-6);
  EXPECT_NEAR(r.entering[0].mean.at("structural"), 5.5, 1e-6);
  EXPECT_NEAR(r.entering[0].mean.at("content"), 17.0 / 3.0, 1e-6);
  EXPECT_NEAR(r.entering[0].mean.at("all"), 36.0 / 8.0, 1e-6);
  EXPECT_EQ(r.entering[0].tokens.at("content"), 3);
  EXPECT_NEAR(r.entering[1].mean.at("content"), 34.0 / 3.0, 1e-5);
  EXPECT_NEAR(r.boundary.mean.at("structural"), 16.5, 1e-5);
  EXPECT_NEAR(r.boundary.mean.at("all"), 13.5, 1e-5);
}

TEST(BoundaryDiagnostics, IdentityMappingRelativeChangeAndCosine) {
  // Per token: unchanged (rel 0, cos 1), rotated 90° (rel √2, cos 0), negated ×2 (rel 2, cos −1),
  // and a zero input (no direction: left out).
  const at::Tensor x = torch::tensor({1.f, 0.f, 1.f, 0.f, 2.f, 0.f, 0.f, 0.f}).view({1, 4, 2});
  const at::Tensor bx = torch::tensor({1.f, 0.f, 0.f, 1.f, -2.f, 0.f, 5.f, 5.f}).view({1, 4, 2});
  const at::Tensor classes = torch::tensor({{3, 3, 2, 0}}, torch::kLong);
  const IdentityMapping m = identity_mapping(x, bx, classes);
  EXPECT_NEAR(m.relative_change.mean.at("content"), std::sqrt(2.0) / 2, 1e-12);
  EXPECT_NEAR(m.relative_change.mean.at("structural"), 2.0, 1e-12);
  EXPECT_NEAR(m.relative_change.mean.at("all"), (std::sqrt(2.0) + 2) / 3, 1e-12);
  EXPECT_EQ(m.relative_change.mean.count("first"), 0u);
  EXPECT_EQ(m.relative_change.tokens.at("all"), 3);
  EXPECT_NEAR(m.cosine.mean.at("content"), 0.5, 1e-12);
  EXPECT_NEAR(m.cosine.mean.at("structural"), -1.0, 1e-12);
  EXPECT_NEAR(m.cosine.mean.at("all"), 0.0, 1e-12);
}

TEST(BoundaryDiagnostics, AnIdentityBlockIsSeenAsOne) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({2, 5, 16}, torch::kBFloat16).requires_grad_(true);
  const at::Tensor classes = torch::randint(0, 4, {2, 5}, torch::kLong);
  const IdentityMapping m = identity_mapping(x, x * 1, classes);
  EXPECT_EQ(m.relative_change.mean.at("all"), 0.0);
  EXPECT_NEAR(m.cosine.mean.at("all"), 1.0, 1e-12);
}

TEST(BoundaryDiagnostics, JsonHasMeansAndCountsPerClass) {
  const ResidualScale r = residual_scale({constant_tokens({1, 2, 3, 4}, 4)}, constant_tokens({2, 2, 2, 2}, 4), one_of_each());
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["entering"].size(), 1u);
  EXPECT_DOUBLE_EQ(j["entering"][0]["mean"]["structural"].get<double>(), 3.0);
  EXPECT_EQ(j["entering"][0]["tokens"]["all"].get<int64_t>(), 4);
  EXPECT_DOUBLE_EQ(j["boundary"]["mean"]["all"].get<double>(), 2.0);
  const nlohmann::json k = to_json(identity_mapping(constant_tokens({1, 1, 1, 1}, 1), constant_tokens({1, 1, 1, 1}, 1), one_of_each()));
  EXPECT_EQ(k.dump(),
            R"({"cosine":{"mean":{"all":1.0,"content":1.0,"first":1.0,"special":1.0,"structural":1.0},)"
            R"("tokens":{"all":4,"content":1,"first":1,"special":1,"structural":1}},)"
            R"("relative_change":{"mean":{"all":0.0,"content":0.0,"first":0.0,"special":0.0,"structural":0.0},)"
            R"("tokens":{"all":4,"content":1,"first":1,"special":1,"structural":1}}})");
}

TEST(BoundaryDiagnostics, MismatchedShapesAndUnknownClassesAreRejected) {
  EXPECT_THROW(residual_scale({torch::zeros({1, 3, 2})}, torch::zeros({1, 4, 2}), one_of_each()), std::invalid_argument);
  EXPECT_THROW(class_means(torch::zeros({1, 4}), torch::tensor({{0, 1, 2, 4}}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(identity_mapping(torch::zeros({1, 4, 2}), torch::zeros({1, 4, 3}), one_of_each()), std::invalid_argument);
}

}  // namespace
}  // namespace deepen
