// Growth schedule: stages, growth steps, active-layer tokens, budget records, single-block control.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "config/input_error.h"
#include "curriculum/growth_schedule.h"
#include "run_folder/active_layer_tokens.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

CurriculumConfig grow_tokens(std::vector<int64_t> stages, std::vector<std::string> tokens) {
  CurriculumConfig c;
  c.mode = CurriculumMode::kGrow;
  c.stages = std::move(stages);
  c.stage_tokens = std::move(tokens);
  return c;
}

using test::error_of;

// A fresh folder under the build tree for records.
std::string scratch(const std::string& name) { return test::scratch_dir("growth_schedule", name).string(); }

TEST(GrowthSchedule, HeaderExampleStepsDepthsAndGrowthPoints) {
  const GrowthSchedule g = make_growth_schedule(grow_tokens({1, 2, 3}, {"10K", "20K", "5000"}), 4096);
  EXPECT_EQ(g.num_stages(), 3);
  EXPECT_EQ(g.stage_steps, (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(g.stage_begin, (std::vector<int64_t>{0, 3, 8}));
  EXPECT_EQ(g.total_steps(), 10);
  std::vector<int64_t> depth;
  std::vector<int64_t> growth;
  std::vector<int64_t> ends;
  for (int64_t s = 0; s < g.total_steps(); ++s) {
    depth.push_back(g.depth_at(s));
    if (g.is_growth_step(s)) growth.push_back(s);
    if (g.is_stage_end(s)) ends.push_back(s);
  }
  EXPECT_EQ(depth, (std::vector<int64_t>{1, 1, 1, 2, 2, 2, 2, 2, 3, 3}));
  EXPECT_EQ(growth, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(ends, (std::vector<int64_t>{2, 7, 9}));
  EXPECT_EQ(g.stage_of(0), 0);
  EXPECT_EQ(g.stage_of(3), 1);
  EXPECT_EQ(g.stage_of(9), 2);
  EXPECT_EQ(g.first_step(2), 8);
  EXPECT_EQ(g.last_step(1), 7);
  EXPECT_EQ(g.final_depth(), 3);
  EXPECT_THROW(g.stage_of(10), std::out_of_range);
  EXPECT_THROW(g.stage_of(-1), std::out_of_range);
  EXPECT_FALSE(g.is_growth_step(0));
  EXPECT_FALSE(g.is_growth_step(10));
}

TEST(GrowthSchedule, ActiveLayerTokensAccumulateTokensTimesDepth) {
  const GrowthSchedule g = make_growth_schedule(grow_tokens({1, 2, 3}, {"10K", "20K", "5000"}), 4096);
  EXPECT_EQ(g.active_layer_tokens_after(0), 0);
  EXPECT_EQ(g.active_layer_tokens_after(1), 4096);
  EXPECT_EQ(g.active_layer_tokens_after(3), 12288);
  EXPECT_EQ(g.active_layer_tokens_after(4), 12288 + 8192);
  EXPECT_EQ(g.active_layer_tokens_after(8), 53248);
  EXPECT_EQ(g.total_active_layer_tokens(), 77824);
  EXPECT_EQ(g.tokens_after(10), 40960);
  // Same as summing step by step.
  int64_t sum = 0;
  for (int64_t s = 0; s < g.total_steps(); ++s) {
    sum += g.tokens_per_step * g.depth_at(s);
    EXPECT_EQ(g.active_layer_tokens_after(s + 1), sum);
  }
  EXPECT_THROW(g.active_layer_tokens_after(11), std::out_of_range);
}

TEST(GrowthSchedule, StageStepsAreTakenAsGiven) {
  CurriculumConfig c;
  c.stages = {2, 4};
  c.stage_steps = {7, 1};
  const GrowthSchedule g = make_growth_schedule(c, 100);
  EXPECT_EQ(g.total_steps(), 8);
  EXPECT_EQ(g.depth_at(6), 2);
  EXPECT_EQ(g.depth_at(7), 4);
  EXPECT_TRUE(g.is_growth_step(7));
  EXPECT_EQ(g.total_active_layer_tokens(), 7 * 100 * 2 + 1 * 100 * 4);
}

TEST(GrowthSchedule, JointRunIsOneStageWithoutGrowth) {
  CurriculumConfig c;
  c.mode = CurriculumMode::kJoint;
  c.stages = {9};
  c.stage_tokens = {"1M"};
  const GrowthSchedule g = make_growth_schedule(c, 32768);
  EXPECT_EQ(g.num_stages(), 1);
  EXPECT_EQ(g.total_steps(), 31);  // ceil(1e6 / 32768) = ceil(30.52)
  for (int64_t s = 0; s < g.total_steps(); ++s) EXPECT_FALSE(g.is_growth_step(s));
}

TEST(GrowthSchedule, TokenBudgetsRoundUpToWholeSteps) {
  EXPECT_EQ(steps_for_tokens(50'000'000, 32768, "k", "50M"), 1526);
  EXPECT_EQ(steps_for_tokens(4096, 4096, "k", "4096"), 1);
  EXPECT_EQ(steps_for_tokens(4097, 4096, "k", "4097"), 2);
}

TEST(GrowthSchedule, BudgetSmallerThanOneStepIsAnError) {
  const std::string msg =
      error_of([] { make_growth_schedule(grow_tokens({1, 2, 3}, {"10K", "20K", "100"}), 4096, 0, "x.toml"); });
  EXPECT_EQ(msg, "x.toml: curriculum.stage_tokens[2] = 100 is less than one step (4096 tokens)");
}

TEST(GrowthSchedule, BudgetSmallerThanOneStepFromAWholeConfigNamesTheFile) {
  const Config cfg = parse_config(R"(
[student]
layers = 2
[data]
seq_len = 128
[parallel]
micro_batch = 4
[curriculum]
stage_tokens = ["1K", "100"]
)", "cfg.toml");
  EXPECT_EQ(tokens_per_step(cfg), 512);
  EXPECT_EQ(error_of([&] { make_growth_schedule(cfg); }),
            "cfg.toml: curriculum.stage_tokens[1] = 100 is less than one step (512 tokens)");
}

TEST(GrowthSchedule, TokensPerStepIsTheGlobalBatch) {
  Config cfg;
  cfg.parallel.students = 4;
  cfg.parallel.micro_batch = 4;
  cfg.parallel.grad_accum = 2;
  cfg.data.seq_len = 1024;
  EXPECT_EQ(tokens_per_step(cfg), 32768);
}

TEST(GrowthSchedule, MatchedJointStepsRoundUp) {
  // Header example: 77824 active-layer tokens at depth 3, 4096 tokens per step -> 7 steps.
  EXPECT_EQ(joint_steps_for_active_layer_tokens(77824, 3, 4096), 7);
  EXPECT_EQ(joint_steps_for_active_layer_tokens(3 * 4096 * 6, 3, 4096), 6);  // exact: no extra step
  EXPECT_EQ(joint_steps_for_active_layer_tokens(1, 9, 4096), 1);
  EXPECT_THROW(joint_steps_for_active_layer_tokens(0, 3, 4096), InputError);
  // The matched run never gets less compute, and at most one step more.
  for (int64_t target : {1, 4095, 12287, 12288, 12289, 77824, 1'000'003}) {
    const int64_t steps = joint_steps_for_active_layer_tokens(target, 3, 4096);
    EXPECT_GE(steps * 3 * 4096, target);
    EXPECT_LT(steps * 3 * 4096 - target, 3 * 4096);
  }
}

TEST(GrowthSchedule, RecordRoundTripsAndMatchedRunReadsIt) {
  const std::string dir = scratch("roundtrip");
  const GrowthSchedule grow = make_growth_schedule(grow_tokens({1, 2, 3}, {"10K", "20K", "5000"}), 4096);
  write_active_layer_tokens(dir, {grow.total_active_layer_tokens(), grow.tokens_after(10), 10, true});
  const ActiveLayerTokensRecord r = read_active_layer_tokens(dir);
  EXPECT_EQ(r.active_layer_tokens, 77824);
  EXPECT_EQ(r.tokens, 40960);
  EXPECT_EQ(r.steps, 10);
  EXPECT_TRUE(r.complete);
  EXPECT_FALSE(std::filesystem::exists(active_layer_tokens_path(dir) + ".tmp"));

  // A matched joint run of the full depth, through a whole config.
  Config cfg = parse_config(R"(
[student]
layers = 3
[data]
seq_len = 1024
[parallel]
micro_batch = 4
[curriculum]
mode = "joint"
)", "matched.toml", {"curriculum.budget=\"active_layer_tokens:" + dir + "\""});
  const GrowthSchedule joint = make_growth_schedule(cfg);
  EXPECT_EQ(joint.num_stages(), 1);
  EXPECT_EQ(joint.final_depth(), 3);
  EXPECT_EQ(joint.total_steps(), 7);
  EXPECT_EQ(joint.total_active_layer_tokens(), 86016);
}

TEST(GrowthSchedule, MissingOrIncompleteRecordIsAClearError) {
  const std::string dir = scratch("incomplete");
  EXPECT_NE(error_of([&] { resolve_budget("active_layer_tokens:" + dir); }).find(dir + "/active_layer_tokens.json: no active-layer-token record"),
            std::string::npos);
  write_active_layer_tokens(dir, {1000, 500, 1200, false});
  EXPECT_EQ(error_of([&] { resolve_budget("active_layer_tokens:" + dir); }),
            dir + " did not finish: active_layer_tokens.json has complete = false after 1200 steps; a matched budget "
                  "needs the finished run");
  std::ofstream(active_layer_tokens_path(dir)) << "{\"active_layer_tokens\": 5, \"tokens\": 1}";
  EXPECT_NE(error_of([&] { read_active_layer_tokens(dir); }).find("steps: missing or not an integer"), std::string::npos);
  std::ofstream(active_layer_tokens_path(dir)) << "{not json";
  EXPECT_NE(error_of([&] { read_active_layer_tokens(dir); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { resolve_budget("tokens:runs/x"); }).find("expected \"active_layer_tokens:<run dir>\""),
            std::string::npos);

  // Through a config, the file and key are named.
  const std::string msg = error_of([&] {
    make_growth_schedule(parse_config("[student]\nlayers = 2\n[curriculum]\nmode = \"joint\"\n", "m.toml",
                                      {"curriculum.budget=\"active_layer_tokens:" + dir + "/nope\""}));
  });
  EXPECT_EQ(msg.rfind("m.toml: curriculum.budget: ", 0), 0u) << msg;
}

TEST(GrowthSchedule, SingleBlockControlIsTheFirstStageAlone) {
  const Config grow = parse_config(R"(
[student]
layers = 4
norm = "post"
[curriculum]
mode = "grow"
stages = [1, 2, 4]
stage_tokens = ["50M", "50M", "100M"]
rewarmup_steps = 100
freeze_prefix = true
)", "g.toml");
  const Config single = single_block_control(grow);
  EXPECT_EQ(single.student.layers, 1);
  EXPECT_EQ(single.student.norm, NormPlacement::kPost);
  EXPECT_EQ(single.curriculum.mode, CurriculumMode::kJoint);
  EXPECT_EQ(single.curriculum.stages, (std::vector<int64_t>{1}));
  EXPECT_EQ(single.curriculum.stage_tokens, (std::vector<std::string>{"50M"}));
  EXPECT_FALSE(single.curriculum.freeze_prefix);
  // Its schedule is exactly the grow run's first stage.
  const GrowthSchedule g = make_growth_schedule(grow);
  const GrowthSchedule s = make_growth_schedule(single);
  EXPECT_EQ(s.total_steps(), g.stage_steps[0]);
  EXPECT_EQ(s.total_active_layer_tokens(), g.active_layer_tokens_after(g.stage_steps[0]));
  // And it survives a print/parse round trip like any config.
  EXPECT_EQ(to_toml(parse_config(to_toml(single), "s.toml")), to_toml(single));
}

TEST(GrowthSchedule, BlocksOfThreeLayersGiveThePapersDepths) {
  CurriculumConfig c;
  c.stages = {1, 2, 3};
  c.block_layers = 3;
  c.stage_steps = {5, 5, 5};
  const GrowthSchedule g = make_growth_schedule(c, 100);
  EXPECT_EQ(g.depths, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_TRUE(g.is_growth_step(5));
  EXPECT_EQ(g.total_active_layer_tokens(), 5 * 100 * (3 + 6 + 9));
}

TEST(GrowthSchedule, JointPhasesAtFixedDepthStartPhasesWithoutGrowth) {
  CurriculumConfig c;
  c.mode = CurriculumMode::kJoint;
  c.stages = {3, 3};
  c.block_layers = 3;
  c.stage_steps = {4, 4};
  const GrowthSchedule g = make_growth_schedule(c, 100);
  EXPECT_EQ(g.depths, (std::vector<int64_t>{9, 9}));
  EXPECT_TRUE(g.is_phase_start(4));
  EXPECT_FALSE(g.is_growth_step(4));
  EXPECT_FALSE(g.is_phase_start(3));
  EXPECT_TRUE(g.is_stage_end(3));
  EXPECT_EQ(g.total_active_layer_tokens(), 8 * 100 * 9);
}

TEST(GrowthSchedule, SingleBlockControlOfBlocksIsOneBlockOfLayers) {
  const Config grow = parse_config(R"(
[student]
layers = 9
[curriculum]
mode = "grow"
block_layers = 3
stage_steps = [50000, 50000, 50000]
phase_policy = "reset"
)", "g.toml");
  const Config single = single_block_control(grow);
  EXPECT_EQ(single.student.layers, 3);
  EXPECT_EQ(single.curriculum.stages, (std::vector<int64_t>{1}));
  EXPECT_EQ(make_growth_schedule(single).depths, (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace deepen
