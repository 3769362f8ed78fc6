// Export: deepen student -> Hugging Face folder -> transformers gives the same fp32 logits; the
// student file and the HF folder both round-trip; post-norm exports are marked as such; pre_scaled's
// scales are folded into the gains; peri and mix are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/input_error.h"
#include "model/student_io.h"
#include "tests/model/order_one_weights.h"
#include "tests/model/qwen3_fixtures.h"

namespace deepen {
namespace {

StudentSpec spec_for(NormPlacement norm, bool tied) {
  StudentSpec spec;
  spec.decoder = DecoderSpec{.hidden = 48, .heads = 6, .kv_heads = 2, .head_dim = 16, .intermediate = 96,
                             .rope_theta = 250000.0, .rms_eps = 1e-6};
  spec.vocab_size = 61;
  spec.max_depth = 4;
  spec.norm = norm;
  spec.tie_embeddings = tied;
  return spec;
}

std::string write_ids(const std::string& dir) {
  std::ofstream(dir + "/ids.txt") << "3 14 15 9 26 5 35 8 9 7 9 3 2\n60 0 1\n42\n";
  return dir + "/ids.txt";
}

TEST(Export, PreNormStudentLoadsInTransformersWithTheSameLogits) {
  for (bool tied : {true, false}) {
    at::manual_seed(11);
    GrowableStudent s(spec_for(NormPlacement::kPre, tied), 2, 3);
    s.append(1, GrowInit::kRandom);  // a grown student exports its active depth
    test::give_order_one_activations(s);
    const std::string tmp = test::temp_dir(std::string("export_pre_") + (tied ? "tied" : "untied"));
    export_student_hf(s, tmp + "/hf");
    const std::string ids = write_ids(tmp);
    const auto r = test::run_command(std::string(test::kPython) + " " +
                                     test::hf_reference_script("run_transformers.py") + " --model " + tmp +
                                     "/hf --ids " + ids + " --out " + tmp + "/hf_logits.safetensors");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto hf = test::read_logits(tmp + "/hf_logits.safetensors");
    const auto lines = test::read_ids(ids);
    ASSERT_EQ(hf.size(), lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      const at::Tensor mine = s.forward(lines[i])[0];
      EXPECT_GT(mine.abs().max().item<double>(), 1.0);
      EXPECT_LT(test::max_abs_diff(mine, hf[i]), 1e-4) << (tied ? "tied" : "untied") << " line " << i;
    }
    // The folder is also a student again, with the same weights.
    EXPECT_EQ(load_student_hf(tmp + "/hf")->parameter_checksum(), s.parameter_checksum());
    EXPECT_FALSE(std::filesystem::exists(tmp + "/hf.tmp"));
  }
}

// LayerNorm-Scaling's 1/sqrt(l) folded into each layer's two norm gains: transformers' Qwen3 computes
// the pre_scaled student (the order of two fp32 multiplies apart), and the folder reads back as a
// pre-norm student whose gains hold the scales.
TEST(Export, PreScaledStudentLoadsInTransformersWithTheSameLogits) {
  at::manual_seed(13);
  GrowableStudent s(spec_for(NormPlacement::kPreScaled, false), 3, 3);
  test::give_order_one_activations(s);
  const std::string tmp = test::temp_dir("export_pre_scaled");
  export_student_hf(s, tmp + "/hf");
  std::ifstream in(tmp + "/hf/config.json");
  EXPECT_EQ(nlohmann::json::parse(in).at("deepen_norm"), "pre");
  const std::string ids = write_ids(tmp);
  const auto r = test::run_command(std::string(test::kPython) + " " + test::hf_reference_script("run_transformers.py") +
                                   " --model " + tmp + "/hf --ids " + ids + " --out " + tmp + "/hf_logits.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto hf = test::read_logits(tmp + "/hf_logits.safetensors");
  const auto lines = test::read_ids(ids);
  ASSERT_EQ(hf.size(), lines.size());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < lines.size(); ++i) {
    const at::Tensor mine = s.forward(lines[i])[0];
    EXPECT_GT(mine.abs().max().item<double>(), 1.0);
    EXPECT_LT(test::max_abs_diff(mine, hf[i]), 1e-4) << "line " << i;
  }
  // Layer 2 (l = 3): the export's gains are the student's times 1/sqrt(3); the final norm unscaled.
  const auto back = load_student_hf(tmp + "/hf");
  EXPECT_EQ(back->spec().norm, NormPlacement::kPre);
  EXPECT_TRUE(at::allclose(back->block(2)->input_layernorm->weight, s.block(2)->input_layernorm->weight / std::sqrt(3.0),
                           1e-6, 0));
  EXPECT_TRUE(at::equal(back->block(0)->post_attention_layernorm->weight, s.block(0)->post_attention_layernorm->weight));
}

TEST(Export, PostNormStudentIsExportedAndMarked) {
  GrowableStudent s(spec_for(NormPlacement::kPost, true), 2, 3);
  const std::string tmp = test::temp_dir("export_post");
  export_student_hf(s, tmp + "/hf");
  std::ifstream in(tmp + "/hf/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config.at("deepen_norm"), "post");
  EXPECT_EQ(config.at("num_hidden_layers"), 2);
  EXPECT_NE(config.at("deepen_note").get<std::string>().find("cannot run it"), std::string::npos);
  const auto file = SafetensorsFile::open(tmp + "/hf/model.safetensors");
  EXPECT_EQ(file.find("model.norm.weight"), nullptr);
  EXPECT_NE(file.find("model.layers.1.post_attention_layernorm.weight"), nullptr);
  const auto back = load_student_hf(tmp + "/hf");
  EXPECT_EQ(back->spec().norm, NormPlacement::kPost);
  EXPECT_EQ(back->parameter_checksum(), s.parameter_checksum());
}

TEST(Export, ExportReplacesAnExistingFolder) {
  GrowableStudent a(spec_for(NormPlacement::kPre, true), 1, 1), b(spec_for(NormPlacement::kPre, true), 3, 2);
  const std::string tmp = test::temp_dir("export_replace");
  export_student_hf(a, tmp + "/hf");
  export_student_hf(b, tmp + "/hf");
  EXPECT_EQ(load_student_hf(tmp + "/hf")->parameter_checksum(), b.parameter_checksum());
}

TEST(StudentFile, SaveAndLoadRoundTripKeepsSpecDepthSeedAndWeights) {
  GrowableStudent s(spec_for(NormPlacement::kPost, false), 2, 77);
  const std::string tmp = test::temp_dir("student_file");
  save_student(s, tmp + "/student.safetensors");
  const auto back = load_student(tmp + "/student.safetensors");
  EXPECT_EQ(back->depth(), 2);
  EXPECT_EQ(back->seed(), 77u);
  EXPECT_EQ(back->spec().max_depth, 4);
  EXPECT_EQ(back->spec().norm, NormPlacement::kPost);
  EXPECT_EQ(back->parameter_checksum(), s.parameter_checksum());
  // Growing the reloaded student gives what growing the original gives.
  s.append(1, GrowInit::kRandom);
  back->append(1, GrowInit::kRandom);
  EXPECT_EQ(back->parameter_checksum(), s.parameter_checksum());
}

// The CPU kernel choice is the run's (its config), not the file's: a resumed trainer gets the kernels
// its config names, so it rounds as the run it continues (e2e.faults.* compare such resumes bit for bit).
TEST(StudentFile, LoadTakesTheCallersCpuKernelsNotTheDefault) {
  GrowableStudent s(spec_for(NormPlacement::kPre, false), 2, 5);
  const std::string tmp = test::temp_dir("student_file_kernels");
  save_student(s, tmp + "/student.safetensors");
  for (CpuKernels k : {CpuKernels::kFused, CpuKernels::kAten, CpuKernels::kAuto})
    EXPECT_EQ(load_student(tmp + "/student.safetensors", at::kCPU, k)->spec().decoder.cpu_kernels, k) << option_name(k);
}

TEST(StudentFile, ATeacherCheckpointIsNotAStudentFile) {
  const std::string fixture = test::tiny_qwen3_fixtures() + "/tied_gqa/model.safetensors";
  try {
    load_student(fixture);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a deepen student file"), std::string::npos) << e.what();
  }
}

TEST(DeepenExport, CommandWritesTheFolderAndSaysWhenTransformersCannotRunIt) {
  const std::string tmp = test::temp_dir("export_cli");
  GrowableStudent pre(spec_for(NormPlacement::kPre, true), 2, 1), post(spec_for(NormPlacement::kPost, true), 2, 1);
  save_student(pre, tmp + "/pre.safetensors");
  std::filesystem::create_directories(tmp + "/ckpt");
  save_student(post, tmp + "/ckpt/student.safetensors");
  auto r = test::run_command(std::string(test::kDeepenBin) + " export --checkpoint " + tmp +
                             "/pre.safetensors --out " + tmp + "/pre_hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(load_student_hf(tmp + "/pre_hf")->parameter_checksum(), pre.parameter_checksum());
  EXPECT_EQ(r.output.find("cannot run it"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pre-norm student, 2 layers -> "), std::string::npos) << r.output;
  r = test::run_command(std::string(test::kDeepenBin) + " export --checkpoint " + tmp + "/ckpt --out " + tmp +
                        "/post_hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cannot run it"), std::string::npos) << r.output;
  r = test::run_command(std::string(test::kDeepenBin) + " export --checkpoint " + tmp + "/absent --out " + tmp +
                        "/x");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// Peri-LN and Mix-LN have no Hugging Face architecture: `deepen export` exits 2 naming the placement
// and the file that still runs (the student's own), and writes nothing.
TEST(DeepenExport, PeriAndMixStudentsAreRefusedNamingThePlacement) {
  const std::string tmp = test::temp_dir("export_refused");
  for (const NormPlacement norm : {NormPlacement::kPeri, NormPlacement::kMix}) {
    const std::string name = option_name(norm);
    StudentSpec spec = spec_for(norm, false);
    GrowableStudent s(spec, 2, 1);
    save_student(s, tmp + "/" + name + ".safetensors");
    const auto r = test::run_command(std::string(test::kDeepenBin) + " export --checkpoint " + tmp + "/" + name +
                                     ".safetensors --out " + tmp + "/" + name + "_hf");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("cannot export to Hugging Face format: student.norm = \"" + name +
                            "\" has no Hugging Face architecture"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("final/student.safetensors"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(tmp + "/" + name + "_hf"));
    EXPECT_FALSE(std::filesystem::exists(tmp + "/" + name + "_hf.tmp"));
  }
}

// The student file knows its layers; the run folder it sits in knows how many make a block
// (curriculum.block_layers in its config.toml), so the line gives both.
TEST(DeepenExport, CommandCountsLayersAndTheRunsBlocks) {
  const std::string tmp = test::temp_dir("export_blocks");
  std::filesystem::create_directories(tmp + "/run/final");
  std::ofstream(tmp + "/run/config.toml")
      << to_toml(parse_config("[student]\nlayers = 4\n[curriculum]\nblock_layers = 2\n", "run"));
  GrowableStudent student(spec_for(NormPlacement::kPre, true), 4, 1);
  save_student(student, tmp + "/run/final/student.safetensors");
  auto r = test::run_command(std::string(test::kDeepenBin) + " export --checkpoint " + tmp + "/run/final --out " + tmp +
                             "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pre-norm student, 4 layers (2 blocks of 2) -> "), std::string::npos) << r.output;
  // The same file outside a run folder: layers only.
  std::filesystem::copy_file(tmp + "/run/final/student.safetensors", tmp + "/alone.safetensors");
  r = test::run_command(std::string(test::kDeepenBin) + " export --checkpoint " + tmp + "/alone.safetensors --out " +
                        tmp + "/hf2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pre-norm student, 4 layers -> "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace deepen
