// Every norm placement's student, forward and backward, against an independent PyTorch implementation
// (tests/hf_reference/placement_reference.py: float64, and float32 for fp32's own rounding floor) at
// every depth a 3-block curriculum passes through, with and without recomputation, on both fp32 CPU
// kernel paths.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>

#include "model/safetensors.h"
#include "model/student.h"
#include "model/student_io.h"
#include "model/tensor_bridge.h"
#include "tests/model/qwen3_fixtures.h"
#include "tests/model/scrambled_student.h"

namespace deepen {
namespace {

struct PlacementCase {
  std::string name;
  NormPlacement norm;
  double mix_post_fraction = 0.25;
  bool entry_norm = false;
  bool tied = false;
};

// Each placement once; post with and without the paper's entry norm; mix with its boundary at the
// first block's end (0.25 of 9 -> 3 post-norm layers) and inside the second block (0.5 -> 5).
const std::vector<PlacementCase>& cases() {
  static const std::vector<PlacementCase> all = {
      {"pre", NormPlacement::kPre, 0.25, false, true},
      {"post_entry", NormPlacement::kPost, 0.25, true, false},
      {"post", NormPlacement::kPost, 0.25, false, true},
      {"peri", NormPlacement::kPeri, 0.25, false, false},
      {"mix", NormPlacement::kMix, 0.25, false, false},
      {"mix_half", NormPlacement::kMix, 0.5, false, true},
      {"pre_scaled", NormPlacement::kPreScaled, 0.25, false, false},
  };
  return all;
}

constexpr int64_t kBlockLayers = 3, kMaxDepth = 9, kBatch = 2, kTokens = 7;

StudentSpec spec_of(const PlacementCase& c) {
  StudentSpec spec;
  spec.decoder.hidden = 32;
  spec.decoder.heads = 4;
  spec.decoder.kv_heads = 2;
  spec.decoder.head_dim = 12;  // not hidden / heads
  spec.decoder.intermediate = 48;
  spec.decoder.rope_theta = 10000.0;
  spec.vocab_size = 61;
  spec.max_depth = kMaxDepth;
  spec.norm = c.norm;
  spec.mix_post_fraction = c.mix_post_fraction;
  spec.entry_norm = c.entry_norm;
  spec.tie_embeddings = c.tied;
  return spec;
}

std::string case_dir(const std::string& root, const PlacementCase& c, int64_t depth) {
  return root + "/" + c.name + "_d" + std::to_string(depth);
}

// The case's student at depths 3, 6 and 9 (grown block by block, each new block scrambled), its
// inputs and the reference's outputs, in a folder of this case's own (ctest runs the cases as
// separate processes, maybe at once): one Python process per case.
std::string reference_root(const PlacementCase& c) {
  const std::string dir = test::temp_dir("placement_reference_" + c.name);
  std::string dirs;
  GrowableStudent s(spec_of(c), kBlockLayers, 2026);
  test::scramble(s, 1);
  for (int64_t depth = kBlockLayers; depth <= kMaxDepth; depth += kBlockLayers) {
    if (depth > s.depth()) {
      const int64_t before = s.depth();
      s.grow_to(depth, GrowInit::kRandom, kBlockLayers);
      test::scramble(s, static_cast<uint64_t>(depth), before);
    }
    const std::string out = case_dir(dir, c, depth);
    std::filesystem::create_directories(out);
    save_student(s, out + "/student.safetensors");
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7 + static_cast<uint64_t>(depth));
    write_tensors(out + "/inputs.safetensors", {{"ids", at::randint(0, 61, {kBatch, kTokens}, gen, at::kLong)},
                                                {"grad", at::randn({kBatch, kTokens, 61}, gen)}});
    dirs += " " + out;
  }
  const auto r = test::run_command("python3 " + test::hf_reference_script("placement_reference.py") + dirs);
  if (r.exit_code != 0) throw std::runtime_error("placement_reference.py failed:\n" + r.output);
  return dir;
}

struct Variant {
  Recompute recompute;
  CpuKernels kernels;
};

class PlacementReference : public ::testing::TestWithParam<PlacementCase> {};

// How far deepen's fp32 may land from the float64 reference: 1e-6 in relative L2 norm, or, where
// fp32 itself cannot get that close, kFloorFactor times fp32's rounding floor at that depth: the
// largest distance of the reference's own fp32 evaluation (the same formulas in PyTorch) from its
// float64 values over the logits and every gradient. With these weights that floor measures
// 1.3e-6 to 2.0e-6 at depth 3 and 1.7e-6 to 7.5e-6 at depth 9, set by the gradients of the q/k
// projections and QK-norm gains (they come through the softmax; the logits' own floor is 3e-7 to
// 1e-6): no fp32 implementation meets 1e-6 there. Two fp32 implementations that order their sums
// differently land within a floor or two of the float64 values (deepen, measured: at most 1.94
// floors, mix); a wrong formula lands some 1e-2 away.
constexpr double kFloorFactor = 3;

// The fp32 floor of one depth's reference ("fp32.<key>" against "<key>").
double fp32_floor(const std::map<std::string, at::Tensor>& reference) {
  double floor = 0;
  for (const auto& [key, t] : reference)
    if (key.starts_with("fp32.")) floor = std::max(floor, test::relative_l2(t, reference.at(key.substr(5))));
  return floor;
}

// Logits and the gradient of sum(logits * grad) with respect to every parameter against the float64
// reference, within max(1e-6, kFloorFactor x the depth's fp32 floor) in relative L2 norm, at every
// depth, for recompute none / layer / mlp on the fused and the aten kernels.
TEST_P(PlacementReference, ForwardAndBackwardEqualTheIndependentImplementationAtEveryDepth) {
  const PlacementCase& c = GetParam();
  const std::string root = reference_root(c);
  std::map<std::string, at::Tensor> reference;
  double floor = 0, allowed = 0, worst = 0, worst_in_floors = 0;
  int above_1e6 = 0, compared = 0;
  auto check = [&](const std::string& what, const at::Tensor& got, const std::string& key) {
    const double e = test::relative_l2(got, reference.at(key));
    EXPECT_LT(e, allowed) << what << " (fp32 floor at this depth " << floor << ")";
    worst = std::max(worst, e);
    worst_in_floors = std::max(worst_in_floors, e / floor);
    above_1e6 += e >= 1e-6;
    ++compared;
  };
  for (int64_t depth = kBlockLayers; depth <= kMaxDepth; depth += kBlockLayers) {
    const std::string dir = case_dir(root, c, depth);
    const auto inputs = read_tensors(dir + "/inputs.safetensors");
    reference = read_tensors(dir + "/reference.safetensors");
    floor = fp32_floor(reference);
    allowed = std::max(1e-6, kFloorFactor * floor);
    std::printf("%s depth %lld: fp32 floor %.2e, allowed %.2e\n", c.name.c_str(), static_cast<long long>(depth), floor,
                allowed);
    for (const Variant v : {Variant{Recompute::kNone, CpuKernels::kFused}, Variant{Recompute::kNone, CpuKernels::kAten},
                            Variant{Recompute::kLayer, CpuKernels::kFused}, Variant{Recompute::kLayer, CpuKernels::kAten},
                            Variant{Recompute::kMlp, CpuKernels::kFused}, Variant{Recompute::kMlp, CpuKernels::kAten}}) {
      const std::string what = c.name + " depth " + std::to_string(depth) + " recompute " +
                               option_name(v.recompute) + " kernels " + option_name(v.kernels);
      auto s = load_student(dir + "/student.safetensors", at::kCPU, v.kernels, v.recompute);
      ASSERT_EQ(s->depth(), depth);
      const at::Tensor logits = s->forward(inputs.at("ids"));
      (logits * inputs.at("grad")).sum().backward();
      check(what + ": logits", logits, "logits");
      int grads = 0;
      for (const auto& [name, p] : hf_named_tensors(*s)) {
        ASSERT_TRUE(p.grad().defined()) << what << ": " << name;
        check(what + ": gradient of " + name, p.grad(), "grad." + name);
        ++grads;
      }
      EXPECT_EQ(2 * (grads * 1u + 1u), reference.size()) << what << ": every tensor of the student has its reference gradient";
    }
  }
  std::printf("%s: over depths 3, 6, 9, logits and every gradient: largest relative L2 error %.2e (%d of %d >= 1e-6), "
              "largest error / the depth's fp32 floor %.2f\n",
              c.name.c_str(), worst, above_1e6, compared, worst_in_floors);
}

// The case's name in test names and messages (not the struct's bytes).
void PrintTo(const PlacementCase& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(Placements, PlacementReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace deepen
