// Report: roles from configs, table values recomputed from eval records, comparisons, crossover, plots.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "curriculum/growth_schedule.h"
#include "report/paper_figures.h"
#include "report/paper_tables.h"
#include "report/report_files.h"
#include "report/report_plots.h"
#include "report/scaling.h"
#include "run_folder/active_layer_tokens.h"
#include "child_process/child_process.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::string scratch(const std::string& name) { return test::scratch_dir("report", name).string(); }

// A synthetic run the way the trainer writes it. Every grow run has stages [1,2,3] x 10 steps of
// 1000 tokens; joint runs 30 steps at depth 3; the matched run 20 steps at depth 3 (60000 active-layer
// tokens, the grow runs' total); single-block runs 10 steps at depth 1. Eval every 5 steps.
struct FakeRun {
  FakeRun(std::string n, const std::string& placement, const std::string& k, int64_t s)
      : name(std::move(n)), norm(parse_option<NormPlacement>(placement, "FakeRun")), kind(kind_of(k)), seed(s) {}
  static RunKind kind_of(const std::string& k) {
    if (k == "matched") return RunKind::kJointMatched;
    if (k == "single") return RunKind::kSingleBlock;
    return parse_option<RunKind>(k, "FakeRun");  // joint | grow | freeze
  }
  std::string name;  // deliberately NOT the role, for the roles-from-config test
  NormPlacement norm;
  RunKind kind;
  int64_t seed;
};

// Validation CE: pre-norm 4 - 0.05·step, post-norm 4.1 - 0.06·step (post overtakes after step 10),
// plus a per-kind offset and a small seed- and kind-dependent term, so means and stds are not trivial.
double fake_ce(const FakeRun& r, int64_t step) {
  const double kind_offset = r.kind == RunKind::kJoint ? 0.02 : r.kind == RunKind::kJointMatched ? 0.01
                             : r.kind == RunKind::kFreeze ? 0.05 : r.kind == RunKind::kSingleBlock ? 0.5 : 0.0;
  const double seed_term = 0.001 * static_cast<double>(r.seed * r.seed % 7) + 0.0003 * r.seed * (r.norm == NormPlacement::kPost);
  return (r.norm == NormPlacement::kPre ? 4.0 - 0.05 * step : 4.1 - 0.06 * step) + kind_offset + seed_term;
}

std::string write_run(const std::string& root, const FakeRun& r, bool finished = true) {
  Config c;
  c.run.name = r.name;
  c.run.seed = r.seed;
  c.run.out_dir = root + "/" + r.name + "/seed" + std::to_string(r.seed);
  c.teacher.checkpoint = "teacher/final/hf";
  c.student.layers = r.kind == RunKind::kSingleBlock ? 1 : 3;
  c.student.norm = r.norm;
  std::vector<int64_t> depths, steps;
  if (appends_blocks(r.kind)) {
    c.curriculum.mode = CurriculumMode::kGrow;
    c.curriculum.stages = depths = {1, 2, 3};
    c.curriculum.stage_steps = steps = {10, 10, 10};
    c.curriculum.freeze_prefix = r.kind == RunKind::kFreeze;
  } else {
    c.curriculum.mode = CurriculumMode::kJoint;
    c.curriculum.stages = depths = {c.student.layers};
    if (r.kind == RunKind::kJointMatched) {
      c.curriculum.budget = "active_layer_tokens:" + root + "/pg/seed" + std::to_string(r.seed);
      steps = {20};
    } else {
      c.curriculum.stage_steps = steps = {r.kind == RunKind::kSingleBlock ? 10 : 30};
    }
  }
  c.eval.every = 5;
  const std::string dir = c.run.out_dir;
  fs::create_directories(dir);
  std::ofstream(dir + "/config.toml") << "# resolved config of run " << r.name << "\n" << to_toml(c);
  int64_t total = 0;
  for (int64_t s : steps) total += s;
  std::ofstream(dir + "/run.json") << json{{"name", r.name}, {"tokenizer", "bytes"}, {"vocab_size", 264},
                                           {"teacher", "full"}, {"students", 1}, {"tokens_per_step", 1000},
                                           {"total_steps", total}, {"stage_depths", depths}, {"stage_steps", steps},
                                           {"config_hash", "x"}, {"resumed", false}}
                                          .dump(2);
  const int64_t last = finished ? total : total / 2;
  std::ofstream eval(dir + "/eval.jsonl");
  std::ofstream diag(dir + "/diagnostics.jsonl");
  std::ofstream metrics(dir + "/metrics.jsonl");
  int64_t alt = 0, stage_first = 0;
  int stage = 0;
  for (int64_t step = 0; step < last; ++step) {
    while (step >= stage_first + steps[static_cast<size_t>(stage)]) stage_first += steps[static_cast<size_t>(stage++)];
    const int64_t depth = depths[static_cast<size_t>(stage)];
    alt += 1000 * depth;
    const bool stage_end = step == stage_first + steps[static_cast<size_t>(stage)] - 1;
    if ((step + 1) % 5 == 0 || stage_end) {
      eval << json{{"step", step}, {"stage", stage}, {"depth", depth}, {"stage_end", stage_end},
                   {"tokens", (step + 1) * 1000}, {"active_layer_tokens", alt}, {"val_ce", fake_ce(r, step)},
                   {"val_kl", fake_ce(r, step) / 10}, {"val_tokens", 4096}}
                  .dump()
           << "\n";
    }
    // Training loss: 3.0 − 0.1·stage, plus after each append a decaying jump (1.0 pre, 2.0 post)·0.5^k
    // at k steps into the stage: the transition metrics have closed forms (see PaperTables below).
    const int64_t k = step - stage_first;
    const double jump = stage > 0 ? (r.norm == NormPlacement::kPre ? 1.0 : 2.0) * std::pow(0.5, static_cast<double>(k)) : 0.0;
    metrics << json{{"step", step}, {"stage", stage}, {"depth", depth}, {"loss", 3.0 - 0.1 * stage + jump}}.dump() << "\n";
    if (appends_blocks(r.kind) && ((step + 1) % 5 == 0)) {
      const bool growth = stage_end && stage < 2;
      const bool final_point = stage_end && stage == 2;
      const double scale = (r.norm == NormPlacement::kPre ? 1.0 + depth : 1.0) * (1 + 0.01 * step);
      json record = {{"step", step}, {"stage", stage}, {"depth", depth},
                     {"event", growth ? "growth" : final_point ? "final" : "periodic"},
                     {"boundary_rms", {{"first", 3 * scale}, {"structural", scale}, {"content", 1.2 * scale}}},
                     {"residual_rms", json::array({{{"content", 1.0}}})},
                     {"identity",
                      {{"rel_change", {{"first", 0.1 * depth}, {"structural", 0.3}, {"content", 0.5 / depth}}},
                       {"cos", {{"first", 0.99}, {"structural", 0.9}, {"content", 0.8}}}}}};
      // Block-boundary RMS: pre-norm's document-boundary tokens 40× the regular ones, growing with depth.
      json rms = json::array();
      for (int64_t b = 0; b <= depth; ++b) {
        const double regular = r.norm == NormPlacement::kPre ? 7.0 + b : 1.0, boundary = r.norm == NormPlacement::kPre ? 40 * regular : 1.5;
        rms.push_back({{"all", {{"count", 60}, {"mean", regular + 0.1}, {"std", r.norm == NormPlacement::kPre ? 5.0 + b : 0.1},
                                {"kurtosis", r.norm == NormPlacement::kPre ? 50.0 : 3.0}}},
                       {"document_boundary", {{"count", 2}, {"mean", boundary}, {"std", 0.0}, {"kurtosis", nullptr}}},
                       {"regular", {{"count", 58}, {"mean", regular}, {"std", 0.5}, {"kurtosis", 3.0}}}});
      }
      record["block_layers"] = 1;
      record["block_rms"] = rms;
      if (stage_end) {
        // Block removal: post-norm blocks all matter (ΔCE 2.5 + b), pre-norm's barely (0.02·(b+1)).
        json blocks = json::array();
        for (int64_t b = 0; b < depth; ++b) {
          const double dce = r.norm == NormPlacement::kPost ? 2.5 + b : 0.02 * (b + 1);
          blocks.push_back({{"block", b}, {"ce_without", 3.0 + dce}, {"delta_ce", dce}, {"angle", 0.1 * (b + 1)}});
        }
        record["block_removal"] = {{"full_ce", 3.0}, {"tokens", 60}, {"block_layers", 1}, {"blocks", blocks}};
      }
      diag << record.dump() << "\n";
    }
  }
  write_active_layer_tokens(dir, {alt, last * 1000, last, finished});
  if (finished && appends_blocks(r.kind)) {
    // Per-token RMS of the finished student at 4 boundaries: 2 document-boundary and 8 regular tokens.
    json boundaries = json::array();
    for (int b = 0; b < 4; ++b)
      boundaries.push_back({{"document_boundary", {300.0, 500.0}},
                            {"regular", {1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0}}});
    std::ofstream(dir + "/final_token_rms.json") << json{{"step", total - 1}, {"depth", 3}, {"block_layers", 1},
                                                         {"boundaries", boundaries}}.dump();
  }
  return dir;
}

// The whole study of DESIGN.md §1 with three seeds, under misleading folder names.
std::string write_study(const std::string& name, bool with_unfinished = false) {
  const std::string root = scratch(name);
  const std::vector<std::tuple<std::string, std::string, std::string>> runs = {
      {"a", "pre", "joint"},  {"b", "post", "joint"},   {"c", "pre", "grow"},     {"pg", "post", "grow"},
      {"e", "post", "matched"}, {"f", "pre", "single"}, {"g", "post", "single"}, {"h", "pre", "freeze"},
      {"i", "post", "freeze"}};
  for (const auto& [n, norm, kind] : runs)
    for (int64_t seed : {1, 2, 3}) write_run(root, {n, norm, kind, seed}, !(with_unfinished && n == "a" && seed == 3));
  return root;
}

// Recomputes a role's final CE statistics straight from the eval.jsonl files, independently of the
// report code: last line's val_ce of every seed.
std::pair<double, double> recompute(const std::string& root, const std::string& run) {
  std::vector<double> v;
  for (int seed : {1, 2, 3}) {
    std::ifstream in(root + "/" + run + "/seed" + std::to_string(seed) + "/eval.jsonl");
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty()) last = line;
    v.push_back(json::parse(last).at("val_ce").get<double>());
  }
  const double mean = (v[0] + v[1] + v[2]) / 3;
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / 2)};
}

std::map<std::string, std::vector<std::string>> read_csv_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  std::map<std::string, std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (line.back() == ',') cells.push_back("");
    rows[cells[0]] = cells;
  }
  return rows;
}

TEST(Report, StatAndStaysAheadWorkedExamples) {
  const Stat s = stat({1, 2, 3});
  EXPECT_EQ(s.n, 3);
  EXPECT_DOUBLE_EQ(s.mean, 2);
  ASSERT_TRUE(s.std);
  EXPECT_DOUBLE_EQ(*s.std, 1);
  EXPECT_FALSE(stat({5}).std);
  EXPECT_EQ(stays_ahead_from({3.0, 2.5, 2.4, 2.2}, {2.9, 2.6, 2.3, 2.3}), std::optional<size_t>(3));
  EXPECT_EQ(stays_ahead_from({3.0, 2.5, 2.2, 2.2}, {2.9, 2.6, 2.3, 2.3}), std::optional<size_t>(1));
  EXPECT_EQ(stays_ahead_from({1.0, 1.0}, {2.0, 1.0}), std::nullopt);  // a tie at the end is not ahead
}

TEST(Report, RolesComeFromConfigsNotFolderNames) {
  const std::string root = write_study("roles");
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  ASSERT_EQ(runs.size(), 27u);
  const Report r = build_report(runs);
  std::vector<std::string> roles;
  for (const auto& s : r.roles) roles.push_back(s.role);
  EXPECT_EQ(roles, (std::vector<std::string>{"pre-joint", "post-joint", "pre-grow", "post-grow", "post-joint-matched",
                                             "pre-single-block", "post-single-block", "pre-freeze", "post-freeze"}));
  for (const auto& s : r.roles) EXPECT_EQ(s.seeds, (std::vector<int64_t>{1, 2, 3})) << s.role;
  EXPECT_EQ(run_kind(runs[0].config, "none (pretraining, CE only)", 3), RunKind::kPretrain);
}

TEST(Report, TableValuesEqualThoseRecomputedFromTheEvalRecords) {
  const std::string root = write_study("values");
  ReportOptions o;
  o.out_dir = root + "/report";
  o.plots = false;
  write_report({root}, o);
  const auto rows = read_csv_rows(o.out_dir + "/report.csv");
  const std::map<std::string, std::string> folder = {
      {"pre-joint", "a"}, {"post-joint", "b"}, {"pre-grow", "c"}, {"post-grow", "pg"}, {"post-joint-matched", "e"},
      {"pre-single-block", "f"}, {"post-single-block", "g"}, {"pre-freeze", "h"}, {"post-freeze", "i"}};
  ASSERT_EQ(rows.size(), folder.size());
  for (const auto& [role, dir] : folder) {
    const auto [mean, sd] = recompute(root, dir);
    ASSERT_TRUE(rows.count(role)) << role;
    const auto& row = rows.at(role);
    EXPECT_NEAR(std::stod(row[5]), mean, 1e-10) << role;
    EXPECT_NEAR(std::stod(row[6]), sd, 1e-10) << role;
    EXPECT_NE(sd, 0.0);
  }
  // The matched run's tokens: 20 steps at depth 3 = the grow run's 60000 active-layer tokens.
  EXPECT_EQ(rows.at("post-joint-matched")[11], "60000");
  EXPECT_EQ(rows.at("post-grow")[11], "60000");

  // Δ(post − pre) under joint and grow, from the same recomputation; and the Markdown shows them.
  const auto cmp = read_csv_rows(o.out_dir + "/comparisons.csv");
  auto delta = [&](const std::string& name) { return std::stod(cmp.at("\"" + name + "\"")[3]); };
  EXPECT_NEAR(delta("grow: post − pre"), recompute(root, "pg").first - recompute(root, "c").first, 1e-10);
  EXPECT_NEAR(delta("joint: post − pre"), recompute(root, "b").first - recompute(root, "a").first, 1e-10);
  EXPECT_NEAR(delta("matched: post-grow − post-joint-matched"), recompute(root, "pg").first - recompute(root, "e").first,
              1e-10);
  std::ifstream md_in(o.out_dir + "/report.md");
  std::stringstream md;
  md << md_in.rdbuf();
  char want[64];
  const auto [pg_mean, pg_sd] = recompute(root, "pg");
  std::snprintf(want, sizeof want, "| post-grow | 1, 2, 3 | %.4f ± %.4f |", pg_mean, pg_sd);
  EXPECT_NE(md.str().find(want), std::string::npos) << want << "\n" << md.str();
}

TEST(Report, PhaseWiseCrossoverPerStageAndOverall) {
  const std::string root = write_study("crossover");
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const Report r = build_report(runs);
  const Crossover* grow = nullptr;
  for (const auto& x : r.crossovers)
    if (x.kind == RunKind::kGrow) grow = &x;
  ASSERT_NE(grow, nullptr);
  // Eval steps 4, 9 | 14, 19 | 24, 29. Post (4.1 - 0.06 s) passes pre (4 - 0.05 s) after step 10;
  // the seed term adds 0.0003·mean(seed) = 0.0006 to post, which moves nothing here.
  ASSERT_EQ(grow->stages.size(), 3u);
  EXPECT_EQ(grow->stages[0].leader, "pre");
  EXPECT_FALSE(grow->stages[0].post_ahead_from_step);
  EXPECT_EQ(grow->stages[1].leader, "post");
  EXPECT_EQ(grow->stages[1].post_ahead_from_step, std::optional<int64_t>(14));
  EXPECT_EQ(grow->stages[1].post_ahead_from_tokens, std::optional<int64_t>(15000));
  EXPECT_EQ(grow->stages[2].post_ahead_from_step, std::optional<int64_t>(24));
  EXPECT_EQ(grow->stages[2].depth, 3);
  EXPECT_EQ(grow->post_ahead_from_step, std::optional<int64_t>(14));
  EXPECT_EQ(grow->eval_points, 6);
}

TEST(Report, UnfinishedRunIsUsedAtItsLastEvalAndNoted) {
  const std::string root = write_study("unfinished", true);
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const Report r = build_report(runs);
  EXPECT_FALSE(r.roles[0].complete);
  bool noted = false;
  for (const auto& n : r.notes) noted |= n.find("a/seed3: unfinished") != std::string::npos;
  EXPECT_TRUE(noted);
  // pre-joint seed 3 stopped after 15 steps: its last eval is step 14.
  EXPECT_EQ(r.roles[0].runs[2]->evals.back().step, 14);
}

// A pretrained teacher in the same folder (deeper, no teacher of its own) is listed as pretrain and
// does not turn the students' full-depth joint runs into single-block runs.
TEST(Report, PretrainedTeacherInTheFolderDoesNotSetTheFullDepth) {
  const std::string root = write_study("with_teacher");
  const std::string t = write_run(root, {"teacher", "pre", "joint", 1});
  Config c = load_config(t + "/config.toml");
  c.student.layers = 6;
  c.curriculum.stages = {6};
  std::ofstream(t + "/config.toml") << to_toml(c);
  std::ofstream(t + "/run.json") << R"j({"teacher": "none (pretraining, CE only)", "stage_steps": [30]})j";
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const Report r = build_report(runs);
  ASSERT_EQ(r.roles.size(), 10u);
  EXPECT_EQ(r.roles[0].role, "pre-joint");
  EXPECT_EQ(r.roles[0].runs.size(), 3u);
  EXPECT_EQ(r.roles.back().role, "pre-pretrain");
}

TEST(Report, DifferentConfigsOfOneRoleAreKeptApart) {
  const std::string root = scratch("apart");
  write_run(root, {"x", "post", "grow", 1});
  const std::string other = write_run(root, {"y", "post", "grow", 1});
  // Same role, different learning rate: a different experiment.
  Config c = load_config(other + "/config.toml");
  c.optim.lr = 1e-3;
  std::ofstream(other + "/config.toml") << to_toml(c);
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const Report r = build_report(runs);
  ASSERT_EQ(r.roles.size(), 2u);
  EXPECT_EQ(r.roles[0].role, "post-grow");
  EXPECT_EQ(r.roles[1].role, "post-grow (y)");
}

// Rewrites a run's config.toml with its [parallel] section changed.
template <class Change>
void change_parallel(const std::string& dir, Change change) {
  Config c = load_config(dir + "/config.toml");
  change(c.parallel);
  std::ofstream(dir + "/config.toml") << to_toml(c);
}

// The same experiment and seed on the same T, P, S in the other rank order, or sharded: layout
// variants of one run (bit-identical, or equal within 1e-5, e2e.pipelines-*, e2e.sharded-*), so one
// stands for the seed and the others are noted, not counted as the seed twice.
TEST(Report, SameLayoutInAnotherRankOrderOrShardingStandsForTheSeedOnce) {
  const std::string root = scratch("order_sharding");
  auto two_pipelines = [](ParallelConfig& p) {
    p.teacher_pipelines = 2;
    p.students = 4;
  };
  change_parallel(write_run(root, {"roles", "post", "grow", 1}), two_pipelines);
  change_parallel(write_run(root, {"pipelines", "post", "grow", 1}), [&](ParallelConfig& p) {
    two_pipelines(p);
    p.rank_order = RankOrder::kPipelines;
  });
  change_parallel(write_run(root, {"sharded", "post", "grow", 1}), [&](ParallelConfig& p) {
    two_pipelines(p);
    p.sharding = Sharding::kGradOp;
  });
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const Report r = build_report(runs);
  ASSERT_EQ(r.roles.size(), 1u);
  EXPECT_EQ(r.roles[0].runs.size(), 1u);
  EXPECT_EQ(r.roles[0].seeds, (std::vector<int64_t>{1}));
  std::string notes;
  for (const auto& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("stands for 2 run(s) of the same experiment and seed on other layouts"), std::string::npos) << notes;
  EXPECT_EQ(notes.find("appears twice"), std::string::npos) << notes;
}

// The same seed on the same layout is still a repeat, named as such.
TEST(Report, SameLayoutAndSeedTwiceIsNotedAsARepeat) {
  const std::string root = scratch("repeat");
  write_run(root, {"x", "post", "grow", 1});
  write_run(root, {"y", "post", "grow", 1});
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const Report r = build_report(runs);
  ASSERT_EQ(r.roles.size(), 1u);
  EXPECT_EQ(r.roles[0].runs.size(), 2u);
  bool twice = false;
  for (const auto& n : r.notes) twice |= n.find("seed 1 appears twice") != std::string::npos;
  EXPECT_TRUE(twice);
}

// A sweep of one T, P, S replicated and sharded is two layouts: two rows told apart by their labels.
TEST(Scaling, ShardedAndReplicatedRunsOfOneLayoutAreTwoRowsOfASweep) {
  const std::string root = scratch("scaling_sharding");
  const std::string replicated = write_run(root, {"replicated", "pre", "joint", 1});
  const std::string sharded = write_run(root, {"sharded", "pre", "joint", 1});
  const std::pair<std::string, double> measured[] = {{replicated, 1000.0}, {sharded, 990.0}};
  for (const auto& [dir, rate] : measured) {
    change_parallel(dir, [&](ParallelConfig& p) {
      p.students = 2;
      if (dir == sharded) p.sharding = Sharding::kGradOp;
    });
    // Distributed (logits on the channel), one rate after the warm-up steps.
    std::ofstream metrics(dir + "/metrics.jsonl");
    for (int step = 0; step < 6; ++step)
      metrics << json{{"step", step}, {"stage", 0}, {"depth", 3}, {"tokens_per_s", rate}, {"channel_bytes", 64.0}}.dump()
              << "\n";
  }
  std::vector<RunData> runs;
  for (const auto& d : find_run_dirs({root})) runs.push_back(load_run(d));
  const std::vector<ScalingSweep> sweeps = find_scaling_sweeps(runs, 2);
  ASSERT_EQ(sweeps.size(), 1u);
  ASSERT_EQ(sweeps[0].rows.size(), 2u);
  EXPECT_EQ(sweeps[0].rows[0].layout, "1x1+2");
  EXPECT_EQ(sweeps[0].rows[0].tokens_per_s, 1000.0);
  EXPECT_EQ(sweeps[0].rows[1].layout, "1x1+2 grad_op");
  EXPECT_EQ(sweeps[0].rows[1].tokens_per_s, 990.0);
}

TEST(Report, DiagnosticsRecordParsing) {
  const DiagnosticPoint d = parse_diagnostic(
      R"({"step": 9, "stage": 0, "depth": 1, "event": "growth", "boundary_rms": {"first": 2.5, "content": 1.0},
          "residual_rms": [{"first": 1.0}, {"first": 2.0}],
          "identity": {"rel_change": {"content": 0.4}, "cos": {"content": 0.9}}})");
  EXPECT_EQ(d.step, 9);
  EXPECT_EQ(d.event, "growth");
  EXPECT_DOUBLE_EQ(d.boundary_rms.at("first"), 2.5);
  ASSERT_EQ(d.residual_rms.size(), 2u);
  EXPECT_DOUBLE_EQ(d.residual_rms[1].at("first"), 2.0);
  EXPECT_DOUBLE_EQ(d.identity_rel.at("content"), 0.4);
  EXPECT_DOUBLE_EQ(d.identity_cos.at("content"), 0.9);
  // The trainer's form: diagnostics/boundary_diagnostics.h's to_json under any key.
  const DiagnosticPoint t = parse_diagnostic(
      R"({"step": 19, "stage": 1, "depth": 2, "event": "growth",
          "residual": {"entering": [{"mean": {"all": 1.0, "first": 4.0}, "tokens": {"all": 8, "first": 1}},
                                    {"mean": {"all": 2.0}, "tokens": {"all": 8}}],
                       "boundary": {"mean": {"content": 3.5, "first": 7.0}, "tokens": {"content": 5, "first": 1}}},
          "identity": {"relative_change": {"mean": {"structural": 0.25}, "tokens": {"structural": 2}},
                       "cosine": {"mean": {"structural": 0.75}, "tokens": {"structural": 2}}}})");
  ASSERT_EQ(t.residual_rms.size(), 2u);
  EXPECT_DOUBLE_EQ(t.residual_rms[0].at("first"), 4.0);
  EXPECT_DOUBLE_EQ(t.boundary_rms.at("content"), 3.5);
  EXPECT_EQ(t.boundary_rms.count("tokens"), 0u);
  EXPECT_DOUBLE_EQ(t.identity_rel.at("structural"), 0.25);
  EXPECT_DOUBLE_EQ(t.identity_cos.at("structural"), 0.75);
  // A bare record (the trainer before diagnostics land) parses with empty parts.
  EXPECT_TRUE(parse_diagnostic(R"({"step": 3, "event": "periodic"})").boundary_rms.empty());
}

TEST(Report, PlotsAreRenderedFromTheRecordsWithGrowthEventsMarked) {
  if (find_in_path("gnuplot").empty()) GTEST_SKIP() << "gnuplot not installed (scripts/setup.sh installs gnuplot-nox)";
  const std::string root = write_study("plots");
  ReportOptions o;
  o.out_dir = root + "/report";
  const Report r = write_report({root}, o);
  for (const char* f : {"val_ce.png", "val_ce.svg", "residual_rms.png", "residual_rms.svg", "identity.png",
                        "identity.svg"}) {
    ASSERT_TRUE(fs::exists(o.out_dir + "/" + f)) << f;
    EXPECT_GT(fs::file_size(o.out_dir + "/" + f), 1000u) << f;
  }
  // Growth at steps 10 and 20 of the grow runs: one vertical line each.
  std::ifstream gp(o.out_dir + "/val_ce.gp");
  std::stringstream script;
  script << gp.rdbuf();
  EXPECT_NE(script.str().find("set arrow from 10, graph 0 to 10, graph 1"), std::string::npos);
  EXPECT_NE(script.str().find("set arrow from 20, graph 0 to 20, graph 1"), std::string::npos);
  // The plotted curve of post-grow is the mean of the records: check its last point.
  std::ifstream dat(o.out_dir + "/val_ce.dat");
  std::string line, block;
  double last_post_grow = NAN;
  while (std::getline(dat, line)) {
    if (line.rfind("# ", 0) == 0) block = line.substr(2, line.find(':') - 2);
    else if (!line.empty() && block == "post-grow") last_post_grow = std::stod(line.substr(line.rfind(' ')));
  }
  EXPECT_NEAR(last_post_grow, recompute(root, "pg").first, 1e-7);
  std::ifstream md(o.out_dir + "/report.md");
  std::stringstream text;
  text << md.rdbuf();
  EXPECT_NE(text.str().find("![val_ce.png](val_ce.png)"), std::string::npos);
  EXPECT_NE(report_files_line(r, o.out_dir).find("plots as PNG and SVG (val_ce, residual_rms, identity, "), std::string::npos)
      << report_files_line(r, o.out_dir);
}

// The closing line of `deepen report` and the demo: the report, its CSV files, and every rendered
// plot once by name (its PNG and SVG), or that none was.
TEST(Report, FilesLineNamesEveryRenderedPlotOnce) {
  Report r;
  EXPECT_EQ(report_files_line(r, "r"), "report: r/report.md, with report.csv, comparisons.csv, runs.csv; no plots rendered");
  r.images = {"val_ce.png", "val_ce.svg", "identity.png", "identity.svg"};
  EXPECT_EQ(report_files_line(r, "r"),
            "report: r/report.md, with report.csv, comparisons.csv, runs.csv and 2 plots as PNG and SVG (val_ce, identity)");
}

// The paper's tables from the synthetic study: numbers recomputed from the records' closed forms.
// Without single-block runs, Table 2 is read from the grow runs' phase-0 end points (under the reset
// policy phase 0 of a grow run is the single-block control, docs/protocol.md "Controls"), mean over
// seeds.
TEST(PaperTables, SingleBlockTableReadsTheGrowRunsPhaseZeroEndWithoutSingleBlockRuns) {
  const std::string root = scratch("table2_from_grow");
  for (const auto& [n, norm, kind] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"a", "pre", "joint"}, {"b", "post", "joint"}, {"c", "pre", "grow"}, {"pg", "post", "grow"}})
    for (int64_t seed : {1, 2, 3}) write_run(root, {n, norm, kind, seed});
  std::vector<RunData> runs;
  for (const auto& dir : find_run_dirs({root})) runs.push_back(load_run(dir));
  const std::string md = paper_tables_markdown(build_report(runs));
  const std::string t2 = md.substr(md.find("## Table 2"), md.find("## Table 3") - md.find("## Table 2"));
  EXPECT_NE(t2.find("Read from the grow runs at the end of phase 0"), std::string::npos) << t2;
  // Phase 0 of the fake grow runs ends at step 9 (10 steps): the row shows that step count and the
  // mean of the three seeds' CE there, and not the runs' final CE.
  for (const char* norm : {"pre", "post"}) {
    double sum = 0, last = 0;
    for (int64_t seed : {1, 2, 3}) {
      sum += fake_ce({"x", norm, "grow", seed}, 9);
      last += fake_ce({"x", norm, "grow", seed}, 29);
    }
    char want[64], final_ce[64];
    std::snprintf(want, sizeof want, "| %s | %s-grow | 10 | %.4f", norm, norm, sum / 3);
    std::snprintf(final_ce, sizeof final_ce, "%.4f", last / 3);
    EXPECT_NE(t2.find(want), std::string::npos) << want << "\n" << t2;
    EXPECT_EQ(t2.find(final_ce), std::string::npos) << final_ce << "\n" << t2;
  }
  // The fake runs keep AdamW state across phases: the table says their phase 0 is not the paper's run.
  EXPECT_NE(t2.find("phase_policy = \"keep\""), std::string::npos) << t2;
}

TEST(PaperTables, InteractionTransitionsRemovalAndResidualScale) {
  const std::string root = write_study("paper_tables");
  ReportOptions o;
  o.out_dir = root + "/report";
  o.plots = false;
  write_report({root}, o);
  // The report points into its runs: keep them alive here.
  std::vector<RunData> runs;
  for (const auto& dir : find_run_dirs({root})) runs.push_back(load_run(dir));
  const Report r = build_report(runs);
  // Table 1: I = (post-grow − pre-grow) − (post-joint − pre-joint), from the eval records directly.
  const auto i = interaction(r);
  ASSERT_TRUE(i.has_value());
  const double want = (recompute(root, "pg").first - recompute(root, "c").first) -
                      (recompute(root, "b").first - recompute(root, "a").first);
  EXPECT_NEAR(i->interaction, want, 1e-12);
  ASSERT_TRUE(i->paired.has_value());
  EXPECT_EQ(i->paired->n, 3);
  EXPECT_NEAR(i->paired->mean, want, 1e-12);  // every role has seeds 1, 2, 3: the paired mean is I

  // Table A4: stages of 10 steps -> windows {1, 1, 1}; baseline = loss of the step before the append,
  // 3.0 (first append) or 2.9 + J·0.5^9 (second: the first jump has not quite decayed), the loss at
  // the append 3.0 − 0.1·stage + J (J = 1 pre, 2 post), so jump = J − 0.1 (− J/512 the second
  // time); recovery: the first k with J·0.5^k <= 0.1 (+ J/512) is k = 4 (pre) or 5 (post): k + 1 steps.
  const std::vector<RoleTransitions> t = transition_table(r);
  std::map<std::string, const RoleTransitions*> by_role;
  for (const auto& x : t) by_role[x.role] = &x;
  ASSERT_TRUE(by_role.count("pre-grow") && by_role.count("post-grow") && by_role.count("post-freeze"));
  for (auto [role, jump, recovery] : {std::tuple{"pre-grow", 0.9, 5.0}, std::tuple{"post-grow", 1.9, 6.0}}) {
    const RoleTransitions& x = *by_role.at(role);
    ASSERT_EQ(x.steps, (std::vector<int64_t>{10, 20})) << role;
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(x.windows[k].smooth_steps, 1);
      const double want_jump = jump - (k == 1 ? (jump + 0.1) / 512 : 0.0);
      EXPECT_NEAR(x.jump[k].mean, want_jump, 1e-12) << role;
      EXPECT_NEAR(x.auc_short[k].mean, want_jump, 1e-12) << role;  // a 1-step window: the jump itself
      EXPECT_EQ(x.recovery[k].mean, recovery) << role;
      EXPECT_EQ(x.not_recovered[k], 0);
    }
  }
  std::ifstream md(o.out_dir + "/report.md");
  std::stringstream text;
  text << md.rdbuf();
  const std::string s = text.str();
  for (const char* want_text :
       {"## Table 1", "| pre | ", "2.7603", "2.7330", "Interaction I = Δ_grow − Δ_joint", "(paper -0.0332)", "## Table 2",
        "19.69", "## Table 3", "## Table 4", "## Table A3", "2.8772", "## Table A4", "(other config)",
        // Table 4: post-grow's last block at the end of the run (step 30), 2.5 + 2.
        "| post-grow | 2 | 30 | 4.5000 ± 0.0000 | 0.3000 ± 0.0000 | ΔCE ≥ 2.38 |",
        "| pre-grow | 2 | 30 | 0.0600 ± 0.0000 | 0.3000 ± 0.0000 | ΔCE 0.02, angle 0.031 |",
        // Table A4 rows, and the residual scale at the end (depth 3, last boundary: pre 7 + 3 = 10 regular).
        "| pre-grow | 10 | 1/1/1 | +0.9000 ± 0.0000 |", "| pre-grow | 30 | 3 | 10.1 | 8 | 50 | 400 | 10 |"})
    EXPECT_NE(s.find(want_text), std::string::npos) << want_text << "\n" << s;
}

TEST(PaperFigures, LogHistogramWorkedExample) {
  const auto h = log_histogram({1, 1, 10, 100}, 1);
  ASSERT_EQ(h.size(), 2u);  // two decades: [1, 10) and [10, 100]
  EXPECT_NEAR(h[0].first, std::sqrt(10.0), 1e-12);
  EXPECT_DOUBLE_EQ(h[0].second, 0.5);
  EXPECT_DOUBLE_EQ(h[1].second, 0.5);
  EXPECT_TRUE(log_histogram({0, -1}, 10).empty());
}

TEST(PaperFigures, EveryFigureIsRenderedWithItsKeyOutsideThePlot) {
  if (find_in_path("gnuplot").empty()) GTEST_SKIP() << "gnuplot not installed (scripts/setup.sh installs gnuplot-nox)";
  const std::string root = write_study("paper_figures");
  ReportOptions o;
  o.out_dir = root + "/report";
  write_report({root}, o);
  for (const char* name : {"fig3a_interaction", "fig3b_crossover", "fig4_block_rms", "fig5a_token_types", "val_ce",
                           "figA1_token_rms", "figA2_block_removal"}) {
    for (const char* ext : {".png", ".svg"}) {
      const std::string f = o.out_dir + "/" + name + ext;
      ASSERT_TRUE(fs::exists(f)) << f;
      EXPECT_GT(fs::file_size(f), 1000u) << f;
    }
    std::ifstream gp(o.out_dir + "/" + name + ".gp");
    std::stringstream script;
    script << gp.rdbuf();
    if (std::string(name) != "val_ce") EXPECT_NE(script.str().find("set key outside"), std::string::npos) << name;
  }
  // Figure 3a's data are the 2×2 means: post-grow's is the recomputed final CE.
  std::ifstream dat(o.out_dir + "/fig3a_interaction.dat");
  std::string line, block;
  double post_grow = NAN;
  while (std::getline(dat, line)) {
    if (line.rfind("# ", 0) == 0) block = line.substr(2, line.find(':') - 2);
    else if (!line.empty() && block == option_name(NormPlacement::kPost) && line.find(" grow ") != std::string::npos)
      post_grow = std::stod(line.substr(line.find(" grow ") + 6));
  }
  EXPECT_NEAR(post_grow, recompute(root, "pg").first, 1e-7);
}

}  // namespace
}  // namespace deepen
