// Norm placements and growth operators in whole training runs: every placement trains through growth
// with recomputation, bf16-mixed and each teacher channel; `deepen forward` gives the trainer's
// logits for every placement; new layers start with fresh AdamW moments under every operator; a
// resume that changes the placement and a teacher of other layer shapes are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"
#include "config/input_error.h"
#include "launch/local_job.h"
#include "model/student_io.h"
#include "model/tensor_bridge.h"
#include "run_folder/jsonl.h"
#include "tests/launch/tiny_world.h"
#include "tests/model/qwen3_fixtures.h"
#include "tests/model/scrambled_student.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

using test::quiet;
using test::TinyWorld;

std::vector<std::string> teacher_student(const TinyWorld& world) {
  return {"student.init=teacher", "student.tie_embeddings=false", "teacher.checkpoint=\"" + world.teacher_dir() + "\""};
}

struct PlacementRun {
  const char* name;
  std::vector<std::string> sets;
  bool exports;             // final/hf written (pre, post, pre_scaled)
  bool keeps_function;      // its growth operator preserves the function (identity on peri)
};

// `deepen forward` on `model` against the trainer's saved student on the same ids, both computing in
// fp32 (deepen forward's default --dtype; a bf16-mixed student's fp32 masters).
void expect_forward_matches(const std::string& model, const fs::path& final_student, const std::string& tmp,
                            double tolerance, const std::string& what) {
  const std::string ids = tmp + "/ids.txt";
  std::ofstream(ids) << "104 101 108 108 111 32 119 111 114 108 100\n116 104 101 32 110 111 114 109\n";
  const std::string out = tmp + "/logits.safetensors";
  const auto r = test::run_command(std::string(test::kDeepenBin) + " forward --model " + model + " --ids " + ids +
                                   " --out " + out + " --device cpu --threads 1");
  ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
  const auto logits = test::read_logits(out);
  const auto student = load_student(final_student.string(), at::kCPU, CpuKernels::kAuto, Recompute::kNone, at::kFloat);
  at::NoGradGuard no_grad;
  const auto lines = test::read_ids(ids);
  ASSERT_EQ(logits.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const at::Tensor want = student->forward(lines[i])[0];
    ASSERT_EQ(logits[i].sizes(), want.sizes()) << what;
    EXPECT_LT(test::relative_l2(logits[i], want), tolerance) << what << " line " << i;
  }
}

// Each placement once, each with another operator and another of the run's settings, so that between
// them every placement, operator, recomputation mode, precision and teacher channel trains through
// the two growths of the tiny 3-stage run; then `deepen forward` reads the finished student.
TEST(PlacementTrain, EveryPlacementTrainsThroughGrowthAndDeepenForwardGivesTheTrainersLogits) {
  TinyWorld world;
  auto with_teacher = [&](std::vector<std::string> sets) {
    for (auto& s : teacher_student(world)) sets.push_back(s);
    return sets;
  };
  const std::vector<PlacementRun> runs = {
      {"pre", {"student.norm=pre", "curriculum.grow_init=random"}, true, false},
      {"post", {"student.norm=post", "curriculum.grow_init=identity", "student.recompute=mlp"}, true, false},
      {"peri", {"student.norm=peri", "curriculum.grow_init=identity", "student.recompute=layer", "distill.logits=topk",
                "distill.topk=16"}, false, true},
      {"mix", with_teacher({"student.norm=mix", "curriculum.grow_init=teacher", "student.recompute=layer",
                            "distill.logits=hidden"}), false, false},
      {"pre_scaled", {"student.norm=pre_scaled", "curriculum.grow_init=stack", "student.precision=bf16-mixed",
                      "student.recompute=mlp"}, true, false},
  };
  for (const PlacementRun& run : runs) {
    ASSERT_EQ(run_train_job(world.config(run.name, run.sets), quiet()), kExitOk) << run.name;
    const fs::path dir = world.dir(run.name);
    // Two growths (1 -> 2 -> 3 layers), each recorded with the CE before and after it.
    int grown = 0;
    for (const auto& j : read_jsonl((dir / "diagnostics.jsonl").string())) {
      if (j.value("event", std::string()) != "grown") continue;
      ++grown;
      const double before = j["ce_before"].get<double>(), after = j["ce_after"].get<double>();
      EXPECT_TRUE(std::isfinite(before) && std::isfinite(after)) << run.name;
      // Identity on peri adds exactly 0 to the residual stream: the same CE, bit for bit.
      if (run.keeps_function) EXPECT_EQ(after, before) << run.name;
    }
    EXPECT_EQ(grown, 2) << run.name;
    for (const auto& m : read_jsonl((dir / "metrics.jsonl").string()))
      EXPECT_TRUE(std::isfinite(m["loss"].get<double>())) << run.name << " step " << m["step"];
    EXPECT_EQ(fs::exists(dir / "final" / "hf" / "config.json"), run.exports) << run.name;
    const std::string tmp = test::temp_dir(std::string("placement_forward_") + run.name);
    const fs::path final_student = dir / "final" / "student.safetensors";
    expect_forward_matches((dir / "final").string(), final_student, tmp, 1e-6, std::string(run.name) + " final/");
    // The export computes the same student (pre_scaled: its 1/sqrt(l) folded into the gains, one
    // rounding apart).
    if (run.exports)
      expect_forward_matches((dir / "final" / "hf").string(), final_student, tmp, 1e-6, std::string(run.name) + " export");
  }
}

// Under curriculum.phase_policy = "keep" the trained layers carry their AdamW moments across a
// growth; the appended layers start from zero moments under every operator (stack copies weights,
// never optimizer state). Checked on the checkpoint after the first step at the new depth: one
// update from zero moments leaves step = 1 and exp_avg_sq = (1 − β2)/(1 − β1)² · exp_avg² = 5 · exp_avg².
TEST(PlacementTrain, NewLayersStartWithFreshAdamMomentsUnderEveryOperator) {
  TinyWorld world;
  for (const GrowInit grow_init : {GrowInit::kRandom, GrowInit::kStack, GrowInit::kIdentity, GrowInit::kTeacher}) {
    const char* op = option_name(grow_init);
    std::vector<std::string> sets = {"curriculum.stage_steps=[4, 4, 4]", std::string("curriculum.grow_init=") + op};
    if (grow_init == GrowInit::kTeacher)
      for (auto& s : teacher_student(world)) sets.push_back(s);
    JobOptions stop = quiet();
    stop.stop_after_steps = 5;  // the checkpoint after step 4, the first step at depth 2
    const std::string name = std::string("moments_") + op;
    ASSERT_EQ(run_train_job(world.config(name, sets), stop), kExitRequeue) << op;
    const auto state = read_tensors((world.dir(name) / "checkpoints" / "step_00000004" / "optimizer.safetensors").string());
    int fresh = 0;
    for (const auto& [key, t] : state) {
      if (!key.starts_with("layers.") || !key.ends_with(".step")) continue;
      const std::string param = key.substr(0, key.size() - 5);
      if (key.starts_with("layers.0.")) {
        EXPECT_EQ(t.item<int64_t>(), 5) << op << " " << param << ": the trained layer keeps its moments";
        continue;
      }
      EXPECT_EQ(t.item<int64_t>(), 1) << op << " " << param;
      const at::Tensor m = state.at(param + ".exp_avg"), v = state.at(param + ".exp_avg_sq");
      const at::Tensor want = 5 * m * m;
      EXPECT_LE(((v - want).abs() - 1e-5 * want).max().item<double>(), 1e-30) << op << " " << param;
      ++fresh;
    }
    EXPECT_EQ(fresh, 11) << op << ": every tensor of the appended layer";
  }
}

TEST(PlacementTrain, ResumeThatChangesThePlacementIsRefusedNamingTheKey) {
  TinyWorld world;
  JobOptions stop = quiet();
  stop.stop_after_steps = 2;
  ASSERT_EQ(run_train_job(world.config("resume_norm", {"student.norm=mix"}), stop), kExitRequeue);
  for (const std::vector<std::string>& change : {std::vector<std::string>{"student.norm=peri"},
                                                  std::vector<std::string>{"student.norm=mix", "student.mix_post_fraction=0.5"},
                                                  std::vector<std::string>{"student.norm=mix", "curriculum.grow_init=stack"}}) {
    const std::string error = test::error_of([&] { run_train_job(world.config("resume_norm", change), quiet()); });
    const std::string key = change.back().substr(0, change.back().find('='));
    EXPECT_NE(error.find(key), std::string::npos) << error;
  }
  // Unchanged, it resumes.
  EXPECT_EQ(run_train_job(world.config("resume_norm", {"student.norm=mix"}), quiet()), kExitOk);
}

TEST(PlacementTrain, TeacherOperatorWithOtherLayerShapesFailsBeforeWritingAnything) {
  TinyWorld world;
  std::vector<std::string> sets = teacher_student(world);
  sets.push_back("curriculum.grow_init=teacher");
  sets.push_back("student.intermediate=48");
  const std::string error = test::error_of([&] { run_train_job(world.config("shapes", sets), quiet()); });
  EXPECT_NE(error.find("student.intermediate = 48 cannot take the teacher's layers: " + world.teacher_dir() +
                       "/config.json has intermediate_size = 64"),
            std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(world.dir("shapes")));
}

// Bad input through the command line: exit 2, the key named, before anything runs.
TEST(PlacementTrain, BadPlacementInputExitsTwoNamingTheKey) {
  TinyWorld world;
  const std::string toml = world.dir("cli.toml").string();
  std::ofstream(toml) << world.toml("cli");
  const std::string deepen = std::string(test::kDeepenBin) + " train " + toml + " --dry-run";
  struct Case {
    std::string sets, message;
  };
  for (const Case& c : {Case{"--set student.norm=mix --set student.mix_post_fraction=1.5",
                             "--set student.mix_post_fraction: must be in (0, 1), got 1.5"},
                        Case{"--set student.norm=ln", "--set student.norm: must be \"pre\" | \"post\" | \"peri\" | \"mix\" | \"pre_scaled\", got \"ln\""},
                        Case{"--set curriculum.grow_init=teacher",
                             "--set curriculum.grow_init: \"teacher\" copies the teacher's layers"},
                        Case{"--set curriculum.grow_init=copy_last", "\"copy_last\" is retired: write \"stack\""}}) {
    const auto r = test::run_command(deepen + " " + c.sets);
    EXPECT_EQ(r.exit_code, 2) << c.sets << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.sets << "\n" << r.output;
  }
}

}  // namespace
}  // namespace deepen
