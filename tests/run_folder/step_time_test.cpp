// Step time records: the parts never exceed the step's wall time, each take starts a new step, and a
// resumed rank's file reads as one run.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(StepTime, PartsAreTimedSpansInsideTheStepAndATakeStartsTheNextStep) {
  StepTimer timer(student_time_parts());
  timer.time(StudentPart::kCompute, [] { sleep_ms(20); });
  const int got = timer.time(StudentPart::kTeacherWait, [] {
    sleep_ms(10);
    return 7;
  });
  EXPECT_EQ(got, 7);  // the timed function's result comes back
  sleep_ms(5);        // untimed: counts in the step, in no part
  const StepTime t = timer.take(3, "student");
  EXPECT_EQ(t.step, 3);
  EXPECT_EQ(t.role, "student");
  ASSERT_EQ(t.parts.size(), student_time_parts().size());
  EXPECT_EQ(t.parts[StudentPart::kCompute].first, "compute");
  // Sleeps last at least as long as asked; the step holds every span and the untimed gap.
  EXPECT_GE(t.parts[StudentPart::kCompute].second, 0.020);
  EXPECT_GE(t.parts[StudentPart::kTeacherWait].second, 0.010);
  EXPECT_GE(t.seconds, t.parts_sum() + 0.005);
  EXPECT_EQ(t.to_json()["parts"]["compute"].get<double>(), t.parts[StudentPart::kCompute].second);

  const StepTime next = timer.take(4, "student");
  EXPECT_EQ(next.parts_sum(), 0.0);
  timer.time(StudentPart::kData, [] { sleep_ms(1); });
  timer.restart();
  EXPECT_EQ(timer.take(5, "student").parts_sum(), 0.0);
}

TEST(StepTime, AResumedRankDropsTheStepsThatRunAgainAndAFreshRunStartsOver) {
  const fs::path dir = test::scratch_dir("step_time", "resume");
  auto record = [](int64_t step) { return StepTime{step, "teacher", 1.0, {{"compute", 0.5}}}; };
  {
    StepTimeLog log(dir.string(), 2, std::nullopt);
    for (int64_t s = 0; s < 6; ++s) log.append(record(s));
  }
  {
    StepTimeLog log(dir.string(), 2, 3);  // the checkpoint after step 3: steps 4, 5 run again
    log.append(record(4));
  }
  {
    StepTimeLog other(dir.string(), 0, std::nullopt);
    other.append(record(0));
  }
  const auto all = read_step_times(dir.string());
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0]["rank"], 0);  // rank order, then step order
  std::vector<int64_t> steps;
  for (size_t i = 1; i < all.size(); ++i) steps.push_back(all[i]["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(all[1]["parts"]["compute"].get<double>(), 0.5);
  StepTimeLog fresh(dir.string(), 2, std::nullopt);
  EXPECT_FALSE(fs::exists(RunFolder(dir.string()).step_time_jsonl(2)) && fs::file_size(RunFolder(dir.string()).step_time_jsonl(2)) > 0);
}

}  // namespace
}  // namespace deepen
