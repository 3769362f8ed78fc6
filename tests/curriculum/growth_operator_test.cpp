// The growth operators' defining properties, per norm placement: stack copies bit for bit, identity
// keeps the logits where the placement allows it (and its change is measured where not), teacher
// takes the mapped teacher layers with the stated norms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "config/input_error.h"
#include "curriculum/growth_operator.h"
#include "curriculum/teacher_layer_map.h"
#include "tests/test_support.h"
#include "model/student_io.h"
#include "tests/model/qwen3_fixtures.h"
#include "tests/model/scrambled_student.h"

namespace deepen {
namespace {

constexpr int64_t kBlock = 3, kDepth = 9;

StudentSpec spec_of(NormPlacement norm, double mix_post_fraction = 0.25) {
  StudentSpec spec;
  spec.decoder.hidden = 32;
  spec.decoder.heads = 4;
  spec.decoder.kv_heads = 2;
  spec.decoder.head_dim = 8;
  spec.decoder.intermediate = 48;
  spec.decoder.rope_theta = 10000.0;
  spec.decoder.cpu_kernels = CpuKernels::kFused;
  spec.vocab_size = 53;
  spec.max_depth = kDepth;
  spec.norm = norm;
  spec.mix_post_fraction = mix_post_fraction;
  spec.tie_embeddings = false;
  return spec;
}

at::Tensor some_ids() { return at::arange(0, 24, at::kLong).remainder(53).view({2, 12}); }

const std::vector<NormPlacement> kPlacements = {NormPlacement::kPre, NormPlacement::kPost, NormPlacement::kPeri,
                                                NormPlacement::kMix, NormPlacement::kPreScaled};

TEST(TeacherLayerMap, EvenlySpacedFromTheTeachersFirstLayer) {
  std::vector<int64_t> paper, demo;
  for (int64_t i = 0; i < 9; ++i) {
    paper.push_back(teacher_layer_of(i, 9, 36));
    demo.push_back(teacher_layer_of(i, 9, 4));
  }
  EXPECT_EQ(paper, (std::vector<int64_t>{0, 4, 8, 12, 16, 20, 24, 28, 32}));
  EXPECT_EQ(demo, (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(teacher_layer_of(2, 3, 3), 2);
  EXPECT_THROW(teacher_layer_of(9, 9, 36), std::invalid_argument);
}

TEST(GrowthOperator, StackCopiesTheStudentsLastBlockBitForBitAtEveryGrowth) {
  for (const NormPlacement norm : kPlacements) {
    GrowableStudent s(spec_of(norm), kBlock, 5);
    test::scramble(s, 11);
    const GrowthOperator op{GrowInit::kStack, kBlock, ""};
    for (int64_t depth : {6, 9}) {
      const int64_t before = s.depth();
      grow_student(s, depth, op);
      ASSERT_EQ(s.depth(), depth);
      for (int64_t j = 0; j < kBlock; ++j) {
        const auto source = s.block(before - kBlock + j)->named_parameters();
        const auto copy = s.block(before + j)->named_parameters();
        ASSERT_EQ(copy.size(), source.size());
        for (const auto& item : copy) {
          EXPECT_TRUE(at::equal(item.value(), source[item.key()]))
              << option_name(norm) << " layer " << before + j << " " << item.key();
          EXPECT_NE(item.value().data_ptr(), source[item.key()].data_ptr());  // a copy, not shared storage
        }
      }
    }
  }
}

// What identity growth does to the function, by placement:
//   kExact  the appended layers add their sub-layers' outputs (exactly 0) to the residual stream
//   kNear   appended post-norm layers before pre-norm ones (mix): they divide each token's vector by
//           its RMS (new gains are 1), and the final norm undoes a per-token scale up to its eps
//   kChange a post-norm student's head reads the renormalized stream: the function changes
enum class Preserves { kExact, kNear, kChange };
struct IdentityCase {
  const char* name;
  NormPlacement norm;
  double fraction;
  Preserves preserves;
};

// Relative L2 change of the logits, and the change of the mean CE on fixed labels, at one growth.
struct Change {
  double logits = 0, ce_before = 0, ce_after = 0;
};
Change identity_growth_change(const IdentityCase& c, int64_t from, int64_t to) {
  GrowableStudent s(spec_of(c.norm, c.fraction), from, 5);
  test::scramble(s, 11);
  at::NoGradGuard no_grad;
  const at::Tensor ids = some_ids(), labels = (ids + 1).remainder(53);
  auto ce = [&](const at::Tensor& logits) {
    return at::cross_entropy_loss(logits.reshape({-1, 53}), labels.reshape({-1})).item<double>();
  };
  const at::Tensor before = s.forward(ids);
  grow_student(s, to, GrowthOperator{GrowInit::kIdentity, kBlock, ""});
  const at::Tensor after = s.forward(ids);
  return {(after - before).norm().item<double>() / before.norm().item<double>(), ce(before), ce(after)};
}

// The measured change per placement at the first growth (3 -> 6 layers of 9), printed for
// docs/model.md: 0 for every placement whose new layers add to the residual stream; a post-norm
// layer renormalizes (norm(norm(x)) != x once the last gain is off 1): the post-norm student's
// function changes; mix's (0.5 of 9: layers 3 and 4 post-norm) only up to the final norm's eps.
TEST(GrowthOperator, IdentityKeepsTheLogitsWhereThePlacementAllowsIt) {
  const IdentityCase cases[] = {{"pre", NormPlacement::kPre, 0.25, Preserves::kExact},
                                {"pre_scaled", NormPlacement::kPreScaled, 0.25, Preserves::kExact},
                                {"peri", NormPlacement::kPeri, 0.25, Preserves::kExact},
                                {"mix (0.25: appended layers pre-norm)", NormPlacement::kMix, 0.25, Preserves::kExact},
                                {"mix (0.5: layers 3, 4 post-norm)", NormPlacement::kMix, 0.5, Preserves::kNear},
                                {"post", NormPlacement::kPost, 0.25, Preserves::kChange}};
  for (const IdentityCase& c : cases) {
    const Change d = identity_growth_change(c, 3, 6);
    std::printf("identity growth 3 -> 6 layers, %s: logits change %.3g (relative L2), CE %.6f -> %.6f (%+.6f)\n",
                c.name, d.logits, d.ce_before, d.ce_after, d.ce_after - d.ce_before);
    switch (c.preserves) {
      case Preserves::kExact:
        EXPECT_EQ(d.logits, 0) << c.name;
        EXPECT_EQ(d.ce_after, d.ce_before) << c.name;
        break;
      case Preserves::kNear:
        EXPECT_LT(d.logits, 1e-6) << c.name;
        EXPECT_GT(d.logits, 0) << c.name << ": the new layers do renormalize";
        break;
      case Preserves::kChange:
        EXPECT_GT(d.logits, 1e-3) << c.name << ": the change is real, so the measurement means something";
        break;
    }
  }
}

// The new layers are not inert: their other weights are random, so training moves them.
TEST(GrowthOperator, IdentityZeroesOnlyTheOutputProjections) {
  GrowableStudent s(spec_of(NormPlacement::kPeri), kBlock, 5);
  grow_student(s, 6, GrowthOperator{GrowInit::kIdentity, kBlock, ""});
  for (int64_t i = 3; i < 6; ++i) {
    EXPECT_EQ(s.block(i)->self_attn->o_proj->weight.abs().max().item<double>(), 0.0);
    EXPECT_EQ(s.block(i)->mlp->down_proj->weight.abs().max().item<double>(), 0.0);
    EXPECT_GT(s.block(i)->self_attn->q_proj->weight.abs().max().item<double>(), 0.0);
    EXPECT_GT(s.block(i)->mlp->up_proj->weight.abs().max().item<double>(), 0.0);
  }
}

// A 4-layer pre-norm teacher at the students' layer shapes, its norm gains away from 1.
std::string make_teacher(const std::string& name) {
  StudentSpec spec = spec_of(NormPlacement::kPre);
  spec.max_depth = 4;
  GrowableStudent teacher(spec, 4, 99);
  test::scramble(teacher, 3);
  const std::string dir = test::temp_dir(name) + "/teacher";
  export_student_hf(teacher, dir);
  return dir;
}

// Teacher layer floor(i · 4 / 9) into student layer i: projections and QK-norms copied, the two
// layer norms copied where they are input norms (pre, pre_scaled, peri, mix's pre-norm layers) and
// 1 where they are output norms (post, mix's post-norm layers); peri's output norms 1.
TEST(GrowthOperator, TeacherCopiesTheMappedTeacherLayersWithTheStatedNorms) {
  const std::string dir = make_teacher("growth_teacher");
  const auto teacher = read_tensors(dir + "/model.safetensors");
  for (const NormPlacement norm : kPlacements) {
    GrowableStudent s(spec_of(norm), kBlock, 5);
    const GrowthOperator op{GrowInit::kTeacher, kBlock, dir};
    start_blocks(s, op);
    grow_student(s, 6, op);
    grow_student(s, 9, op);
    for (int64_t i = 0; i < kDepth; ++i) {
      const int64_t t = teacher_layer_of(i, kDepth, 4);
      const bool post = s.block(i)->placement.norms == LayerNorms::kPost;
      for (const auto& item : s.block(i)->named_parameters()) {
        const std::string& key = item.key();
        const std::string what = std::string(option_name(norm)) + " layer " + std::to_string(i) + " " + key;
        const bool layer_norm = key == "input_layernorm.weight" || key == "post_attention_layernorm.weight";
        const bool output_norm = key == "attn_output_layernorm.weight" || key == "mlp_output_layernorm.weight";
        if (output_norm || (layer_norm && post)) {
          EXPECT_TRUE(at::equal(item.value(), at::ones_like(item.value()))) << what;
        } else {
          EXPECT_TRUE(at::equal(item.value(), teacher.at("model.layers." + std::to_string(t) + "." + key))) << what;
        }
      }
    }
  }
}

TEST(GrowthOperator, TeacherOfOtherLayerShapesIsRefusedNamingBoth) {
  const std::string dir = make_teacher("growth_teacher_shapes");
  StudentSpec spec = spec_of(NormPlacement::kPre);
  spec.decoder.intermediate = 64;
  GrowableStudent s(spec, kBlock, 5);
  const std::string error = test::error_of([&] { start_blocks(s, GrowthOperator{GrowInit::kTeacher, kBlock, dir}); });
  EXPECT_NE(error.find("student.intermediate = 64 cannot take the teacher's layers: " + dir +
                       "/config.json has intermediate_size = 48 (curriculum.grow_init = \"teacher\" copies them)"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace deepen
