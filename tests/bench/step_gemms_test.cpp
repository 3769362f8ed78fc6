// The step bound's GEMM list (bench/step_gemms.h): the kd bench's FLOPs and parameters by hand, every
// shape's FLOPs against the cost model's matmul count, and the backward GEMMs' layouts.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/step_gemms.h"

namespace deepen::bench {
namespace {

// bench/kd_step_bench's step: teacher 4 x 256, untied student 3 x 256, 4/2 heads of 64,
// intermediate 768, V = 151,936, 4 x 256 tokens.
StepShape kd_bench() {
  StepShape s;
  s.teacher = ModelShape{"teacher", 4, 256, 4, 2, 64, 768, 151936, true};
  s.student = ModelShape{"student", 3, 256, 4, 2, 64, 768, 151936, false};
  s.batch = 4;
  s.seq = 256;
  return s;
}

double total_flops(const std::vector<Gemm>& gemms, const std::string& part_prefix = "") {
  double f = 0;
  for (const Gemm& g : gemms)
    if (g.part.rfind(part_prefix, 0) == 0) f += g.flops();
  return f;
}

TEST(StepGemms, KdBenchStepHasTheWorkedExamplesFlopsAndParameters) {
  const std::vector<Gemm> g = step_gemms(kd_bench());
  // 7 teacher projections + its head, 7 x 3 student projection GEMMs + 3 head GEMMs.
  EXPECT_EQ(g.size(), 8u + 21u + 3u);
  EXPECT_DOUBLE_EQ(total_flops(g), 339'570'851'840.0);
  EXPECT_DOUBLE_EQ(total_flops(g, "teacher head") + total_flops(g, "student head"), 4 * 79'658'221'568.0);
  EXPECT_DOUBLE_EQ(total_flops(g, "teacher layers"), 4 * 1'610'612'736.0);
  EXPECT_EQ(student_parameters(kd_bench()), 80'152'704);
  EXPECT_DOUBLE_EQ(adamw_bytes(student_parameters(kd_bench())), 28.0 * 80'152'704);
  EXPECT_DOUBLE_EQ(attention_flops(kd_bench()), (4 + 9) * 4.0 * 4 * 64 * 128.5 * 1024);
}

// The paper rehearsal's step at depth 2 (bf16 teacher 2 x 256, tied student 2 x 512 with 8/4 heads,
// intermediate 1024, 2 x 8,192 tokens): the list's FLOPs equal the cost model's matmul weights, 2 FLOP
// per weight per token forward and 6 for the student's forward + backward.
TEST(StepGemms, FlopsEqualTheCostModelsMatmulCountAtThePaperRehearsalsShapes) {
  StepShape s;
  s.teacher = ModelShape{"teacher", 2, 256, 4, 2, 64, 768, 151936, true};
  s.student = ModelShape{"student", 2, 512, 8, 4, 64, 1024, 151936, true};
  s.teacher_dtype = FloatDtype::kBf16;
  s.batch = 2;
  s.seq = 8192;
  const double n = 16384;
  const double teacher = 2 * n * (2.0 * static_cast<double>(block_matmul_params(s.teacher)) + 256.0 * 151936);
  const double student = 6 * n * (2.0 * static_cast<double>(block_matmul_params(s.student)) + 512.0 * 151936);
  const std::vector<Gemm> g = step_gemms(s);
  EXPECT_DOUBLE_EQ(total_flops(g, "teacher"), teacher);
  EXPECT_DOUBLE_EQ(total_flops(g, "student"), student);
  for (const Gemm& x : g) EXPECT_EQ(x.dtype, x.part.rfind("teacher", 0) == 0 ? FloatDtype::kBf16 : FloatDtype::kFp32) << x.name;
  // Tied: the head is the embedding, counted once.
  EXPECT_EQ(student_parameters(s), 2 * block_params(s.student) + 151936 * 512 + 512);
}

// The layouts LibTorch's linear backward uses: dX = dy · W (plain), dW = dyᵀ · x (N reduced).
TEST(StepGemms, HeadBackwardGemmsHaveTheLayoutsOfLinearsBackward) {
  const std::vector<Gemm> g = step_gemms(kd_bench());
  auto find = [&](const std::string& name) {
    const auto it = std::find_if(g.begin(), g.end(), [&](const Gemm& x) { return x.name == name; });
    EXPECT_NE(it, g.end()) << name;
    return *it;
  };
  const Gemm fwd = find("student head forward"), dx = find("student head dX"), dw = find("student head dW");
  EXPECT_EQ(std::tuple(fwd.m, fwd.k, fwd.n, fwd.a_transposed, fwd.b_transposed, fwd.tokens_in_k),
            std::tuple(int64_t{1024}, int64_t{256}, int64_t{151936}, false, true, false));
  EXPECT_EQ(std::tuple(dx.m, dx.k, dx.n, dx.a_transposed, dx.b_transposed, dx.tokens_in_k),
            std::tuple(int64_t{1024}, int64_t{151936}, int64_t{256}, false, false, false));
  EXPECT_EQ(std::tuple(dw.m, dw.k, dw.n, dw.a_transposed, dw.b_transposed, dw.tokens_in_k),
            std::tuple(int64_t{151936}, int64_t{1024}, int64_t{256}, true, false, true));
  EXPECT_EQ(find("teacher layer gate forward").count, 4);
  EXPECT_EQ(find("student layer down dW").count, 3);
}

}  // namespace
}  // namespace deepen::bench
