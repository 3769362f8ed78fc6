// The paper's student (student.init = "teacher"): the teacher's embedding (frozen), LM head and
// final norm (as the boundary norm) are copied; pre- and post-norm students have the same
// parameter count; a student narrower than its teacher is refused naming both widths; its Hugging
// Face export reads back with the same logits.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "config/config.h"
#include "config/input_error.h"
#include "model/safetensors.h"
#include "model/student.h"
#include "model/student_from_teacher.h"
#include "model/student_io.h"
#include "model/tensor_bridge.h"
#include "tests/model/qwen3_fixtures.h"

namespace deepen {
namespace {

// The fixtures: "untied_mha" (hidden 32, untied head) and "tied_gqa" (hidden 32, tied head). Both
// have randomized final-norm gains, so "the boundary norm starts at the teacher's" is not "ones".
StudentConfig paper_student(const std::string& norm, int64_t hidden = 32) {
  StudentConfig cfg;
  cfg.layers = 3; cfg.hidden = hidden; cfg.heads = 4; cfg.kv_heads = 2; cfg.head_dim = 8;
  cfg.intermediate = 64; cfg.norm = parse_option<NormPlacement>(norm, "paper_student"); cfg.tie_embeddings = false; cfg.init = StudentInit::kTeacher;
  return cfg;
}

at::Tensor teacher_tensor(const std::string& dir, const std::string& name) {
  return checkpoint_tensor(SafetensorsCheckpoint::open(dir), name).clone();
}

int64_t numel_of(const GrowableStudent& s) {
  int64_t n = 0;
  for (const auto& p : s.parameters()) n += p.numel();
  return n;
}

TEST(StudentFromTeacher, EmbeddingHeadAndBoundaryNormStartAsTheTeachers) {
  for (const std::string fixture : {"untied_mha", "tied_gqa"}) {
    const std::string dir = test::tiny_qwen3_fixtures() + "/" + fixture;
    const at::Tensor embed = teacher_tensor(dir, "model.embed_tokens.weight");
    const at::Tensor head = fixture == std::string("tied_gqa") ? embed : teacher_tensor(dir, "lm_head.weight");
    const at::Tensor final_norm = teacher_tensor(dir, "model.norm.weight");
    ASSERT_GT((final_norm - 1).abs().max().item<double>(), 0.01) << "the fixture's norm must not be ones";
    for (const std::string norm : {"pre", "post"}) {
      GrowableStudent s(student_spec_from_config(paper_student(norm), 97), 3, 42);
      copy_teacher_ends(s, dir);
      auto params = s.named_parameters();
      const std::string boundary = norm == option_name(NormPlacement::kPre) ? "norm.weight" : "entry_norm.weight";
      EXPECT_EQ(s.boundary_norm_name(), boundary);
      EXPECT_TRUE(at::equal(params["embed_tokens.weight"], embed)) << fixture << " " << norm;
      EXPECT_TRUE(at::equal(params["lm_head.weight"], head)) << fixture << " " << norm;
      EXPECT_TRUE(at::equal(params[boundary], final_norm)) << fixture << " " << norm;
      // The embedding is frozen (no gradient, so no optimizer state); head and norm train.
      EXPECT_FALSE(params["embed_tokens.weight"].requires_grad());
      EXPECT_TRUE(params["lm_head.weight"].requires_grad());
      EXPECT_TRUE(params[boundary].requires_grad());
      EXPECT_EQ(s.named_trainable_parameters().size(), params.size() - 1);
      // Decoder layers keep Qwen3's init: std 0.02 (a 32x32 q_proj has 1024 draws: the sample std
      // is within 0.02·(1 ± 5/sqrt(2·1024)), i.e. ±11 %, at five standard errors).
      const double std = params["layers.0.self_attn.q_proj.weight"].std().item<double>();
      EXPECT_NEAR(std, 0.02, 0.0023) << fixture << " " << norm;
      // unfreeze_all (used by the freeze control) leaves the teacher's embedding frozen.
      s.unfreeze_all();
      EXPECT_FALSE(params["embed_tokens.weight"].requires_grad());
    }
  }
}

TEST(StudentFromTeacher, PreAndPostNormStudentsHaveExactlyTheSameParameterCount) {
  const GrowableStudent pre(student_spec_from_config(paper_student("pre"), 97), 3, 1);
  const GrowableStudent post(student_spec_from_config(paper_student("post"), 97), 3, 1);
  EXPECT_EQ(numel_of(pre), numel_of(post));
  EXPECT_EQ(pre.named_parameters().size(), post.named_parameters().size());
  // The same count with the norm in a different place: pre's final norm, post's entry norm.
  EXPECT_TRUE(pre.named_parameters().contains("norm.weight"));
  EXPECT_FALSE(pre.named_parameters().contains("entry_norm.weight"));
  EXPECT_TRUE(post.named_parameters().contains("entry_norm.weight"));
  EXPECT_FALSE(post.named_parameters().contains("norm.weight"));
}

TEST(StudentFromTeacher, PostNormEntryNormNormalizesTheEmbeddingBeforeBlockZero) {
  GrowableStudent s(student_spec_from_config(paper_student("post"), 97), 2, 5);
  copy_teacher_ends(s, test::tiny_qwen3_fixtures() + "/untied_mha");
  const at::Tensor ids = at::arange(0, 20, at::kLong).view({2, 10});
  auto params = s.named_parameters();
  const at::Tensor raw = at::embedding(params["embed_tokens.weight"], ids);
  const at::Tensor want = rms_norm(raw, params["entry_norm.weight"], 1e-6, CpuKernels::kAten);
  // Same formula, fused kernel vs op sequence: fp32 rounding of a 32-term mean, far below 1e-5.
  EXPECT_LT(test::max_abs_diff(s.embed(ids), want), 1e-5);
  EXPECT_LT(test::max_abs_diff(s.residual_stream(ids)[0], want), 1e-5);
}

TEST(StudentFromTeacher, AStudentNarrowerThanTheTeacherIsRefusedNamingBothWidths) {
  GrowableStudent s(student_spec_from_config(paper_student("pre", 64), 97), 1, 1);
  try {
    copy_teacher_ends(s, test::tiny_qwen3_fixtures() + "/untied_mha");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("student.hidden = 64"), std::string::npos) << what;
    EXPECT_NE(what.find("hidden_size = 32"), std::string::npos) << what;
  }
  StudentConfig tied = paper_student("pre");
  tied.tie_embeddings = true;
  EXPECT_THROW(student_spec_from_config(tied, 97), InputError);
}

TEST(StudentFromTeacher, ExportOfEitherPlacementReadsBackWithEqualLogits) {
  for (const std::string norm : {"pre", "post"}) {
    GrowableStudent s(student_spec_from_config(paper_student(norm), 97), 3, 9);
    copy_teacher_ends(s, test::tiny_qwen3_fixtures() + "/untied_mha");
    {  // O(1) logits (the fixture's embedding and head already are; the blocks are std 0.02)
      at::NoGradGuard no_grad;
      for (auto& item : s.named_parameters())
        if (item.key().rfind("layers.", 0) == 0 && item.key().find("norm") == std::string::npos)
          item.value().normal_(0, 1 / std::sqrt(static_cast<double>(item.value().size(1))));
    }
    const std::string tmp = test::temp_dir("paper_student_export_" + norm);
    export_student_hf(s, tmp + "/hf");
    const auto back = load_student_hf(tmp + "/hf");
    EXPECT_EQ(back->parameter_checksum(), s.parameter_checksum()) << norm;
    EXPECT_EQ(back->boundary_norm_name(), s.boundary_norm_name());
    const at::Tensor ids = at::arange(0, 26, at::kLong).remainder(97).view({2, 13});
    const at::Tensor mine = s.forward(ids);
    EXPECT_GT(mine.abs().max().item<double>(), 0.5);
    // Same weights, same operations in the same order: equal bit for bit.
    EXPECT_TRUE(at::equal(back->forward(ids), mine)) << norm;
    if (norm == option_name(NormPlacement::kPost)) {
      const auto file = SafetensorsFile::open(tmp + "/hf/model.safetensors");
      EXPECT_NE(file.find("model.entry_norm.weight"), nullptr);
      EXPECT_EQ(file.find("model.norm.weight"), nullptr);
    }
  }
}

}  // namespace
}  // namespace deepen
