// Study cost: the worked example of plan/study_cost.h and what bounds a shared group's pace.
#include <gtest/gtest.h>

#include "plan/study_cost.h"

namespace deepen {
namespace {

RunRates teacher_bound(const std::string& id) { return RunRates{id, 8, 8, 1e9, 1e5, 1e6, 2e5, 1e5}; }

TEST(StudyCost, TheWorkedExampleOfTheHeader) {
  const std::vector<RunRates> runs = {teacher_bound("a"), teacher_bound("b")};
  const StudyCost c = study_cost(runs, {{0, 1}});
  EXPECT_NEAR(c.alone_device_hours, 2 * 16 * 1e4 / 3600.0, 1e-9);
  EXPECT_NEAR(c.alone_job_hours, 2 * 1e4 / 3600.0, 1e-9);
  EXPECT_NEAR(c.shared_device_hours, 24 * 1e4 / 3600.0, 1e-9);
  EXPECT_NEAR(c.shared_job_hours, 1e4 / 3600.0, 1e-9);
}

TEST(StudyCost, AGroupMovesAtItsSlowestRunAndHoldsItsDevicesForItsLongest) {
  std::vector<RunRates> runs = {teacher_bound("fast"), teacher_bound("slow")};
  runs[1].student_tokens_per_s = 5e4;  // a 9-layer joint run beside a 3-layer one
  runs[1].alone_tokens_per_s = 5e4;
  runs[0].tokens = 2e9;                // and the fast one twice as long
  const StudyCost c = study_cost(runs, {{0, 1}});
  EXPECT_NEAR(c.shared_job_hours, 2e9 / 5e4 / 3600.0, 1e-9);
  EXPECT_NEAR(c.shared_device_hours, 24 * 2e9 / 5e4 / 3600.0, 1e-9);
  // Groups of one are the runs alone.
  const StudyCost apart = study_cost(runs, {{0}, {1}});
  EXPECT_NEAR(apart.shared_device_hours, apart.alone_device_hours, 1e-9);
}

TEST(StudyCost, ManyRunsOnOneChannelBecomeChannelBound) {
  std::vector<RunRates> runs;
  for (int i = 0; i < 20; ++i) runs.push_back(teacher_bound("r" + std::to_string(i)));
  std::vector<size_t> all;
  for (size_t i = 0; i < runs.size(); ++i) all.push_back(i);
  const StudyCost c = study_cost(runs, {all});
  EXPECT_NEAR(c.shared_job_hours, 1e9 / (1e6 / 20) / 3600.0, 1e-9);  // 5e4 tokens/s: the channel
}

// The example of cheapest_pipelines: a teacher-bound pair gets a second pipeline, not a fourth.
TEST(StudyCost, AGroupTakesTheTeacherPipelinesThatStopTheTeacherBeingItsBound) {
  const std::vector<RunRates> runs = {teacher_bound("a"), teacher_bound("b")};
  EXPECT_EQ(price_group(runs, {0, 1}, 1).bound, "teacher");
  EXPECT_EQ(cheapest_pipelines(runs, {0, 1}), 2);
  const GroupPrice two = price_group(runs, {0, 1}, 2);
  EXPECT_EQ(two.devices, 32);
  EXPECT_EQ(two.bound, "students");
  EXPECT_NEAR(two.device_hours, 32 * 5e3 / 3600.0, 1e-9);
  EXPECT_NEAR(study_cost(runs, {{0, 1}}, {2}).shared_device_hours, two.device_hours, 1e-9);
  EXPECT_NEAR(price_group(runs, {0, 1}, 4).device_hours, 48 * 5e3 / 3600.0, 1e-9) << "more pipelines, no more speed";
  // Students that are the bound already: fewer pipelines save their devices.
  std::vector<RunRates> slow = runs;
  for (RunRates& r : slow) r.student_tokens_per_s = 2.5e4;
  EXPECT_EQ(cheapest_pipelines(slow, {0, 1}), 1);
}

// The example of cheapest_groups, in the header's units: a 150-unit pair, a 100-unit run and two
// 50-unit runs of one class; the teacher is 8 devices, each run's students 8.
TEST(StudyCost, TheCheapestGroupsCutRunsSortedByLength) {
  auto run = [](const std::string& id, double tokens) {
    RunRates r = teacher_bound(id);
    r.teacher_tokens_per_s = 3e5;  // the students are the bound: sharing costs no pace
    r.alone_tokens_per_s = 2e5;
    r.tokens = tokens;
    return r;
  };
  const std::vector<RunRates> runs = {run("short-a", 50e8), run("long-a", 150e8), run("mid", 100e8),
                                      run("long-b", 150e8), run("short-b", 50e8)};
  const auto groups = cheapest_groups(runs, {{0, 1, 2, 3, 4}});
  // Alone the mid run costs 16 devices x 100 units; beside the long pair only its 8 students for 150.
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(groups[1], (std::vector<size_t>{0, 4}));
  EXPECT_LT(study_cost(runs, groups).shared_device_hours, study_cost(runs, {{1, 3}, {2}, {0, 4}}).shared_device_hours);
  EXPECT_EQ(cheapest_groups(runs, {{0, 1, 2, 3, 4}}, 2).size(), 3u) << "a cap of 2 runs";
  // A teacher that holds only two runs' queues in its memory: the mid run stays alone.
  std::vector<RunRates> small = runs;
  for (RunRates& r : small) r.max_shared_runs = 2;
  EXPECT_EQ(cheapest_groups(small, {{0, 1, 2, 3, 4}}).size(), 3u);
}

}  // namespace
}  // namespace deepen
