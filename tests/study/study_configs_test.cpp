// The shipped studies (configs/demo, configs/paper): every run expands to a valid config, the paper
// studies hold every run of DESIGN.md §1, and `deepen train --dry-run` accepts each run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "report/report.h"
#include "study/study.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::string source(const std::string& rel) { return (fs::path(test::kSourceDir) / rel).string(); }

std::vector<std::string> study_files() {
  return {source("configs/demo/study.toml"), source("configs/demo/study_small.toml"),
          source("configs/paper/study-qwen3-8b.toml"), source("configs/paper/study-qwen3-1.7b.toml"),
          source("configs/paper/study-qwen3-0.6b.toml")};
}

TEST(StudyConfigs, EveryRunOfEveryShippedStudyExpandsToAValidConfig) {
  for (const auto& file : study_files()) {
    SCOPED_TRACE(file);
    const StudyPlan plan = expand_study(load_study(file));  // throws on any invalid run config
    EXPECT_FALSE(plan.jobs.empty());
  }
}

// The roles the report gives the paper runs, from their configs: all of DESIGN.md §1, three seeds.
TEST(StudyConfigs, PaperStudiesHoldEveryRunOfTheDesignWithMatchedBudgetsResolved) {
  for (const char* f : {"configs/paper/study-qwen3-8b.toml", "configs/paper/study-qwen3-1.7b.toml",
                        "configs/paper/study-qwen3-0.6b.toml"}) {
    SCOPED_TRACE(f);
    const StudyPlan plan = expand_study(load_study(source(f)));
    std::map<std::string, std::set<int64_t>> seeds_by_role;
    int64_t full = 0;
    for (const auto& j : plan.jobs) full = std::max(full, j.config.student.layers);
    EXPECT_EQ(full, 9);
    for (const auto& j : plan.jobs) {
      seeds_by_role[j.config.student.norm + "-" + run_kind(j.config, "full", full)].insert(j.seed);
      if (!j.config.curriculum.budget.empty()) {
        EXPECT_EQ(j.config.curriculum.budget,
                  "active_layer_tokens:" + plan.spec.out_dir + "/post-grow/seed" + std::to_string(j.seed));
        ASSERT_EQ(j.depends_on.size(), 1u);
      }
    }
    const std::set<int64_t> three = {1, 2, 3};
    for (const char* role : {"pre-joint", "post-joint", "pre-grow", "post-grow", "post-joint-matched",
                             "pre-single-block", "post-single-block", "pre-freeze", "post-freeze"})
      EXPECT_EQ(seeds_by_role[role], three) << role;
    EXPECT_EQ(seeds_by_role.size(), 9u);
  }
  // The 8B study is the paper's: Qwen3-8B teacher, nine-layer student.
  const StudyPlan p = expand_study(load_study(source("configs/paper/study-qwen3-8b.toml")));
  EXPECT_EQ(p.jobs[0].config.teacher.checkpoint, "/models/Qwen3-8B");
}

// Every value the abstract does not give is marked in the paper configs: each key line of the base
// configs is either one the paper fixes or carries "# ASSUMPTION" (or is operational).
TEST(StudyConfigs, PaperBaseConfigsMarkTheirAssumptions) {
  const std::set<std::string> given_or_operational = {
      "name", "out_dir", "seed", "threads", "tokenizer", "train", "valid", "shard_tokens", "checkpoint", "dtype",
      "layers", "vocab_size", "norm", "rope_theta", "mode", "freeze_prefix", "logits", "vocab_chunk",
      "teacher_pipelines", "teacher_stages", "students", "grad_accum", "backend", "activation_dtype", "every",
      "keep", "heartbeat_s", "watchdog_s", "diagnostics_every", "diagnostic_batch",
      "sources", "parquet_text_column", "id_field"};  // the paper's data: FineWeb-Edu sample-10BT
  for (const char* f : {"configs/paper/qwen3-8b.toml", "configs/paper/qwen3-1.7b.toml", "configs/paper/qwen3-0.6b.toml"}) {
    std::ifstream in(source(f));
    std::string line;
    int marked = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#' || line[0] == '[') continue;
      const std::string key = line.substr(0, line.find(' '));
      if (line.find("# ASSUMPTION") != std::string::npos) {
        ++marked;
        continue;
      }
      EXPECT_TRUE(given_or_operational.count(key)) << f << ": " << line;
    }
    EXPECT_GE(marked, 20) << f;
  }
}

// `deepen train BASE --set ... --dry-run` for every run of every shipped study (the trainer's own
// validation, on the exact arguments the study runner passes).
TEST(StudyConfigs, DeepenTrainDryRunAcceptsEveryRun) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  const std::string log = (fs::path(test::kBinaryDir) / "test_scratch" / "study_configs_dry_run.log").string();
  fs::create_directories(fs::path(log).parent_path());
  for (const auto& file : study_files()) {
    const StudyPlan plan = expand_study(load_study(file));
    for (const auto& job : plan.jobs) {
      ProcessSpec p;  // the runner's arguments, in one process: a dry run starts no ranks
      p.argv = {test::kDeepenBin, plan.spec.command, plan.spec.base};
      for (const auto& o : job.overrides) {
        p.argv.push_back("--set");
        p.argv.push_back(o);
      }
      p.argv.push_back("--dry-run");
      p.log_path = log;
      fs::remove(log);
      EXPECT_EQ(run_process(p), 0) << file << " " << job.id() << ": " << shell_join(p.argv) << "\n"
                                   << tail_lines(log, 20);
    }
  }
}

}  // namespace
}  // namespace deepen
