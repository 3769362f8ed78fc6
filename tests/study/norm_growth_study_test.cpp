// The norm-growth studies (configs/studies): the full factorial design at the paper's scale and at
// demo scale, every run a valid config with the paper's protocol, runs sharing one teacher.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "config/config.h"
#include "study/local_runner.h"
#include "study/study_plan.h"
#include "tests/study/study_dry_run.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::string source(const std::string& rel) { return (fs::path(test::kSourceDir) / rel).string(); }

using Cell = std::tuple<NormPlacement, CurriculumMode, GrowInit>;

// Every placement × curriculum × operator cell once per seed, nothing else.
void expect_full_design(const StudyPlan& plan, const std::vector<int64_t>& seeds) {
  std::map<Cell, std::set<int64_t>> cells;
  for (const StudyJob& job : plan.jobs) {
    const Config& c = job.config;
    cells[Cell(c.student.norm, c.curriculum.mode, c.curriculum.grow_init)].insert(c.run.seed);
    EXPECT_EQ(c.student.mix_post_fraction, 0.25) << job.id();
    EXPECT_EQ(c.curriculum.phase_policy, PhasePolicy::kReset) << job.id();
    EXPECT_EQ(c.student.init, StudentInit::kTeacher) << job.id();
    EXPECT_EQ(c.curriculum.block_layers, 3) << job.id();
  }
  EXPECT_EQ(cells.size(), 4u * 2u * 2u);
  for (NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost, NormPlacement::kPeri, NormPlacement::kMix})
    for (CurriculumMode mode : {CurriculumMode::kJoint, CurriculumMode::kGrow})
      for (GrowInit op : {GrowInit::kTeacher, GrowInit::kIdentity}) {
        const std::set<int64_t>& got = cells[Cell(norm, mode, op)];
        EXPECT_EQ(got, std::set<int64_t>(seeds.begin(), seeds.end()))
            << option_name(norm) << " " << option_name(mode) << " " << option_name(op);
      }
}

TEST(NormGrowthStudy, PaperScaleHoldsTheWholeDesignOnThePapersProtocol) {
  const StudyPlan plan = expand_study(load_study(source("configs/studies/norm-growth.toml")));
  ASSERT_EQ(plan.jobs.size(), 48u);
  expect_full_design(plan, {42, 43, 44});
  for (const StudyJob& job : plan.jobs) {
    const Config& c = job.config;
    EXPECT_EQ(c.student.hidden, 4096) << job.id();
    EXPECT_EQ(c.teacher.checkpoint, "/models/Qwen3-8B") << job.id();
    // Joint: 9 layers, one 50k phase; grow: 3 x 50k (the paper's budgets).
    if (c.curriculum.mode == CurriculumMode::kJoint) EXPECT_EQ(c.curriculum.stage_steps, std::vector<int64_t>{50000});
    else EXPECT_EQ(c.curriculum.stage_steps, (std::vector<int64_t>{50000, 50000, 50000}));
  }
  // Each seed its own data order: the runs of one seed share teacher passes, in groups of the study's cap.
  ASSERT_FALSE(plan.groups.empty());
  size_t in_groups = 0;
  for (const StudyGroup& g : plan.groups) {
    EXPECT_LE(g.members.size(), static_cast<size_t>(plan.spec.max_group_runs));
    in_groups += g.members.size();
    for (size_t m : g.members)  // a shared teacher pass serves one data order: one seed
      EXPECT_EQ(plan.jobs[m].config.run.seed, plan.jobs[g.members.front()].config.run.seed) << plan.jobs[m].id();
  }
  EXPECT_EQ(in_groups, plan.jobs.size());
  EXPECT_LT(plan.groups.size(), plan.jobs.size());
}

TEST(NormGrowthStudy, DemoScaleHoldsTheWholeDesign) {
  const StudyPlan plan = expand_study(load_study(source("configs/studies/norm-growth-demo.toml")));
  ASSERT_EQ(plan.jobs.size(), 48u);
  expect_full_design(plan, {1, 2, 3});
}

// `deepen train --dry-run` on one run per operator and placement family, with the runner's arguments.
TEST(NormGrowthStudy, DeepenTrainDryRunAcceptsItsRuns) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  const std::string log = (fs::path(test::kBinaryDir) / "test_scratch" / "norm_growth_dry_run.log").string();
  fs::create_directories(fs::path(log).parent_path());
  const StudyPlan plan = expand_study(load_study(source("configs/studies/norm-growth.toml")), {}, {"peri-grow-teacher", "mix-joint-identity"});
  ASSERT_EQ(plan.jobs.size(), 6u);
  for (const auto& job : plan.jobs) {
    std::string command;
    EXPECT_EQ(test::study_job_dry_run(plan, job, log, command), 0) << job.id() << ": " << command << "\n"
                                                                  << tail_lines(log, 20);
  }
}

}  // namespace
}  // namespace deepen
