// The factorial report: t quantiles and intervals, cells over seeds, interaction contrasts against
// pre-norm, operator contrasts, the crossover of every pair, the loss change at growth, its files;
// and the paper's 2 x 2 study left without the factorial section.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "report/factorial.h"
#include "report/report_files.h"
#include "report/t_interval.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

TEST(TInterval, QuantilesAreStudentsT) {
  EXPECT_NEAR(t_quantile(0.975, 1), 12.7062, 1e-4);
  EXPECT_NEAR(t_quantile(0.975, 2), 4.3027, 1e-4);
  EXPECT_NEAR(t_quantile(0.975, 10), 2.2281, 1e-4);
  EXPECT_NEAR(t_quantile(0.975, 1e9), 1.9600, 1e-4);
  // Welch's degrees of freedom need not be whole (value from integrating the density with mpmath).
  EXPECT_NEAR(t_quantile(0.975, 2.5), 3.574655, 1e-5);
  EXPECT_NEAR(t_quantile(0.025, 4), -2.7764, 1e-4);
}

TEST(TInterval, MeanIntervalIsTTimesTheStandardError) {
  const Interval i = mean_interval({1, 2, 3});
  EXPECT_EQ(i.n, 3);
  EXPECT_DOUBLE_EQ(i.mean, 2);
  ASSERT_TRUE(i.half_width);
  EXPECT_NEAR(*i.half_width, 4.302653 / std::sqrt(3.0), 1e-6);  // s = 1
  EXPECT_FALSE(mean_interval({5}).half_width);
}

TEST(TInterval, ContrastIsPairedBySeedElseWelch) {
  // The header's example: a − b per seed {1, 1, 2}.
  const Interval paired = contrast_interval({{1, {{1, 1}, {2, 2}, {3, 3}}}, {-1, {{1, 0}, {2, 1}, {3, 1}}}});
  EXPECT_EQ(paired.method, "paired");
  EXPECT_EQ(paired.n, 3);
  EXPECT_NEAR(paired.mean, 4.0 / 3, 1e-12);
  EXPECT_NEAR(*paired.half_width, 4.302653 * std::sqrt(1.0 / 3) / std::sqrt(3.0), 1e-6);
  // No common seeds: Welch. a = {1, 2, 3} (var 1), b = {0, 2} (var 2): se² = 1/3 + 2/2, df = se⁴ /
  // ((1/3)²/2 + 1²/1) = (4/3)² / (1/18 + 1) = 1.684.
  const Interval welch = contrast_interval({{1, {{1, 1}, {2, 2}, {3, 3}}}, {-1, {{7, 0}, {8, 2}}}});
  EXPECT_EQ(welch.method, "Welch");
  EXPECT_NEAR(welch.mean, 1, 1e-12);
  EXPECT_NEAR(welch.df, (16.0 / 9) / (1.0 / 18 + 1), 1e-9);
  EXPECT_NEAR(*welch.half_width, t_quantile(0.975, welch.df) * std::sqrt(4.0 / 3), 1e-9);
}

// A synthetic run: joint 30 steps at 3 layers, grow 3 x 10 steps at 1, 2, 3; eval every 5 steps.
// Final CE = base(norm) + (grow ? growth(norm, op) : 0) + 0.001 · seed², so every cell's mean and
// every contrast has a closed form; grow runs write a "grown" record at each growth.
double base_ce(NormPlacement n) { return 3.0 + 0.01 * static_cast<int>(n); }
double growth_gain(NormPlacement n, GrowInit op) {
  return (n == NormPlacement::kPre ? 0.0 : -0.02 * static_cast<int>(n)) + (op == GrowInit::kIdentity ? 0.005 : 0.0);
}

void write_run(const std::string& root, NormPlacement norm, bool grow, GrowInit op, int64_t seed) {
  Config c;
  c.run.name = std::string(option_name(norm)) + (grow ? "-grow-" : "-joint-") + option_name(op);
  c.run.seed = seed;
  c.run.out_dir = root + "/" + c.run.name + "/seed" + std::to_string(seed);
  c.teacher.checkpoint = "teacher";
  c.student.layers = 3;
  c.student.norm = norm;
  c.student.init = StudentInit::kTeacher;  // the teacher operator needs the teacher's student
  c.student.tie_embeddings = false;
  c.curriculum.grow_init = op;
  c.curriculum.mode = grow ? CurriculumMode::kGrow : CurriculumMode::kJoint;
  c.curriculum.stages = grow ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{3};
  c.curriculum.stage_steps = grow ? std::vector<int64_t>{10, 10, 10} : std::vector<int64_t>{30};
  fs::create_directories(c.run.out_dir);
  std::ofstream(c.run.out_dir + "/config.toml") << to_toml(c);
  std::ofstream(c.run.out_dir + "/run.json") << json{{"teacher", "full"}, {"tokens_per_step", 100}, {"total_steps", 30},
                                                     {"stage_depths", c.curriculum.stages},
                                                     {"stage_steps", c.curriculum.stage_steps}}
                                                    .dump();
  std::ofstream eval(c.run.out_dir + "/eval.jsonl"), diag(c.run.out_dir + "/diagnostics.jsonl");
  const double final_ce = base_ce(norm) + (grow ? growth_gain(norm, op) : 0) + 0.001 * static_cast<double>(seed * seed);
  for (int64_t step = 4; step < 30; step += 5) {
    const int stage = grow ? static_cast<int>(step / 10) : 0;
    const double ce = final_ce + 0.01 * static_cast<double>(29 - step);
    eval << json{{"step", step}, {"stage", stage}, {"depth", grow ? stage + 1 : 3}, {"stage_end", (step + 1) % 10 == 0},
                 {"tokens", (step + 1) * 100}, {"active_layer_tokens", 0}, {"val_ce", ce}}
                .dump()
         << "\n";
  }
  if (grow)
    for (int64_t at : {10, 20})
      diag << json{{"step", at}, {"stage", at / 10}, {"depth", at / 10 + 1}, {"event", "grown"}, {"depth_before", at / 10},
                   {"grow_init", option_name(op)}, {"ce_before", 3.0}, {"ce_after", 3.0 + 0.1 * static_cast<int>(norm) + 0.001 * seed}}
                  .dump()
           << "\n";
}

std::string factorial_study(const std::string& name) {
  const std::string root = test::scratch_dir("factorial", name).string();
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost, NormPlacement::kPeri, NormPlacement::kMix})
    for (GrowInit op : {GrowInit::kIdentity, GrowInit::kTeacher})
      for (bool grow : {false, true})
        for (int64_t seed : {1, 2, 3}) write_run(root, norm, grow, op, seed);
  return root;
}

TEST(Factorial, CellsContrastsCrossoverAndGrowthChangesFromTheRuns) {
  std::vector<RunData> runs;
  for (const auto& dir : find_run_dirs({factorial_study("design")})) runs.push_back(load_run(dir));
  const Report report = build_report(runs);
  // With two operators the operator is part of every role's name.
  EXPECT_NE(find_role(report, NormPlacement::kPeri, RunKind::kGrow, GrowInit::kIdentity), nullptr);
  EXPECT_EQ(find_role(report, NormPlacement::kPeri, RunKind::kGrow, GrowInit::kIdentity)->role, "peri-grow+identity");
  const std::optional<Factorial> f = factorial_design(report);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->placements.size(), 4u);
  // The teacher's layers come before identity: teacher is the operators' baseline.
  ASSERT_EQ(f->operators, (std::vector<GrowInit>{GrowInit::kTeacher, GrowInit::kIdentity}));
  ASSERT_EQ(f->cells.size(), 16u);
  // A cell: seeds 1, 2, 3 add 0.001, 0.004, 0.009 (mean 0.014/3, s = 0.0040415).
  const FactorialCell& c = f->cells.front();
  EXPECT_EQ(c.norm, NormPlacement::kPre);
  EXPECT_EQ(c.kind, RunKind::kJoint);
  EXPECT_EQ(c.val_ce.n, 3);
  EXPECT_NEAR(c.val_ce.mean, 3.0 + 0.014 / 3, 1e-12);
  EXPECT_NEAR(*c.val_ce.half_width, 4.302653 * 0.0040414519 / std::sqrt(3.0), 1e-8);
  // I(p | o) = growth_gain(p, o) − growth_gain(pre, o): the seed terms cancel seed by seed, so the
  // paired interval has zero width.
  ASSERT_EQ(f->interactions.size(), 6u);  // post, peri, mix at two operators
  for (const Contrast& i : f->interactions) {
    EXPECT_NEAR(i.value.mean, growth_gain(i.norm, i.op) - growth_gain(NormPlacement::kPre, i.op), 1e-12) << i.name;
    EXPECT_EQ(i.value.method, "paired");
    EXPECT_EQ(i.value.n, 3);
    EXPECT_NEAR(*i.value.half_width, 0, 1e-9);
  }
  EXPECT_EQ(f->interactions.front().name, "I(post | teacher)");
  // G(p | identity) = +0.005 for every placement; the three-way contrasts vanish.
  int operator_contrasts = 0;
  for (const Contrast& k : f->operator_contrasts) {
    const bool three_way = k.name.find(" − I(") != std::string::npos;
    EXPECT_NEAR(k.value.mean, three_way ? 0.0 : 0.005, 1e-12) << k.name;
    ++operator_contrasts;
  }
  EXPECT_EQ(operator_contrasts, 4 + 3);
  // Every placement against pre, at each operator and kind.
  EXPECT_EQ(f->crossovers.size(), 2u * 2u * 3u);
  // Each grow cell's two growths, Δ = 0.1 · placement + 0.001 · seed.
  ASSERT_EQ(f->growth_changes.size(), 16u);
  for (const GrowthStepChange& g : f->growth_changes)
    EXPECT_NEAR(g.delta_ce.mean, 0.1 * static_cast<int>(g.norm) + 0.002, 1e-12);

  const std::string md = factorial_markdown(*f);
  for (const char* part : {"## Factorial design: norm placement × curriculum × growth operator",
                           "| peri | grow | identity | 3 |", "### Interaction with the curriculum, against pre-norm",
                           "| I(peri | teacher) |", "### Growth operators against teacher",
                           "### Phase-wise crossover against pre-norm", "### Loss change at each growth"})
    EXPECT_NE(md.find(part), std::string::npos) << part << "\n" << md;
  const std::string csv = factorial_csv(*f);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 17);  // the header and a row per cell
  std::vector<std::string> notes;
  std::vector<std::string> names;
  for (const Figure& fig : factorial_figures(*f, notes)) names.push_back(fig.name);
  EXPECT_EQ(names, (std::vector<std::string>{"factorial_interaction", "factorial_val_ce", "factorial_contrasts"}));
}

TEST(Factorial, ReportWritesItsSectionAndTables) {
  ReportOptions o;
  o.out_dir = test::scratch_dir("factorial", "report_out").string();
  o.plots = false;
  const Report report = write_report({factorial_study("files")}, o);
  std::ifstream in(o.out_dir + "/report.md");
  const std::string md((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(md.find("## Factorial design"), std::string::npos);
  EXPECT_TRUE(fs::exists(o.out_dir + "/factorial.csv"));
  EXPECT_TRUE(fs::exists(o.out_dir + "/contrasts.csv"));
  EXPECT_NE(report_files_line(report, o.out_dir).find("factorial.csv, contrasts.csv"), std::string::npos);
}

// The paper's study (pre and post, one operator) has no factorial section: its report stays the 2 x 2.
TEST(Factorial, ThePapersTwoByTwoHasNoFactorialSection) {
  const std::string root = test::scratch_dir("factorial", "paper").string();
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost})
    for (bool grow : {false, true})
      for (int64_t seed : {1, 2}) write_run(root, norm, grow, GrowInit::kRandom, seed);
  std::vector<RunData> runs;
  for (const auto& dir : find_run_dirs({root})) runs.push_back(load_run(dir));
  const Report report = build_report(runs);
  EXPECT_FALSE(factorial_design(report));
  EXPECT_NE(find_role(report, NormPlacement::kPost, RunKind::kGrow), nullptr);  // plain role names
  EXPECT_EQ(find_role(report, NormPlacement::kPost, RunKind::kGrow)->role, "post-grow");
}

}  // namespace
}  // namespace deepen
