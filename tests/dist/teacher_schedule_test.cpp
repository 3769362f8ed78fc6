// The teacher's forward passes per step when runs share it: one per distinct micro-batch.
#include <gtest/gtest.h>

#include "dist/teacher_schedule.h"

namespace deepen {
namespace {

// A run whose micro-batch identity is its position, except where `parted` says its stream differs.
ScheduledRun run(int64_t first, int64_t end, std::function<bool(int64_t)> eval_after,
                 std::function<bool(const BatchKey&)> parted = {}) {
  ScheduledRun r;
  r.counts = BatchCounts{1, 2, 1};
  r.first_step = first;
  r.end_step = end;
  r.eval_after = std::move(eval_after);
  r.identity = [parted](const BatchKey& k) {
    std::vector<int64_t> id{static_cast<int64_t>(k.kind), k.step, k.student, k.index};
    if (parted && parted(k)) id.push_back(99);
    return id;
  };
  return r;
}

TEST(TeacherSchedule, TheWorkedExampleOfTheHeader) {
  const std::vector<ScheduledRun> runs = {
      run(0, 10, [](int64_t) { return false; }),
      run(0, 10, [](int64_t s) { return s == 4; },
          [](const BatchKey& k) { return k.kind == BatchKind::kTrain && k.step == 4 && k.index == 1; })};
  const std::vector<TeacherItem> items = teacher_items(runs, 4, 0, 1);
  ASSERT_EQ(items.size(), 4u);
  const BatchKey m0{BatchKind::kTrain, 4, 0, 0}, m1{BatchKind::kTrain, 4, 0, 1}, e0{BatchKind::kEval, 4, 0, 0};
  EXPECT_EQ(items[0].key, m0);
  ASSERT_EQ(items[0].to.size(), 2u);  // one pass, two deliveries
  EXPECT_EQ(items[0].to[0].run, 0);
  EXPECT_EQ(items[0].to[1].run, 1);
  EXPECT_EQ(items[1].key, m1);
  ASSERT_EQ(items[1].to.size(), 1u);
  EXPECT_EQ(items[1].to[0].run, 0);
  EXPECT_EQ(items[2].key, m1);
  ASSERT_EQ(items[2].to.size(), 1u);
  EXPECT_EQ(items[2].to[0].run, 1);
  EXPECT_EQ(items[3].key, e0);
  ASSERT_EQ(items[3].to.size(), 1u);
  EXPECT_EQ(items[3].to[0].run, 1);
  EXPECT_EQ(items[3].to[0].key, e0);
}

TEST(TeacherSchedule, EqualStreamsCostOnePassForEveryRun) {
  auto never = [](int64_t) { return false; };
  const std::vector<ScheduledRun> runs = {run(0, 5, never), run(0, 5, never), run(0, 5, never), run(0, 5, never)};
  int64_t passes = 0, deliveries = 0;
  for (int64_t step = 0; step < 5; ++step)
    for (const TeacherItem& item : teacher_items(runs, step, 0, 1)) {
      ++passes;
      deliveries += static_cast<int64_t>(item.to.size());
    }
  EXPECT_EQ(passes, 10);
  EXPECT_EQ(deliveries, 40);
}

TEST(TeacherSchedule, AFinishedRunLeavesAndTheOthersGoOn) {
  auto never = [](int64_t) { return false; };
  const std::vector<ScheduledRun> runs = {run(0, 3, never), run(2, 6, never)};
  EXPECT_EQ(teacher_items(runs, 1, 0, 1).front().to.size(), 1u);  // run 1 resumed at step 2
  EXPECT_EQ(teacher_items(runs, 2, 0, 1).front().to.size(), 2u);
  const auto late = teacher_items(runs, 4, 0, 1);
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(late.front().to.front().run, 1);
  EXPECT_TRUE(teacher_items(runs, 6, 0, 1).empty());
}

TEST(TeacherSchedule, RunsWithDifferentBatchCountsCannotShare) {
  auto never = [](int64_t) { return false; };
  std::vector<ScheduledRun> runs = {run(0, 5, never), run(0, 5, never)};
  runs[1].counts.grad_accum = 3;
  EXPECT_THROW(teacher_items(runs, 0, 0, 1), std::invalid_argument);
}

}  // namespace
}  // namespace deepen
