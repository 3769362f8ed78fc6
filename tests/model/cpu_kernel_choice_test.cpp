// Fused-or-ops choice for fp32 CPU steps: parsing, shape classes, calibration budget, the decision
// and the once-per-shape-class cache, with stand-in steps of known speed (no LibTorch).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "config/input_error.h"
#include "model/cpu_kernel_choice.h"

namespace deepen {
namespace {

TEST(CpuKernelChoice, ParsesTheThreeModesAndNamesTheKeyOnAnythingElse) {
  for (CpuKernels m : {CpuKernels::kAuto, CpuKernels::kFused, CpuKernels::kAten})
    EXPECT_EQ(parse_option<CpuKernels>(option_name(m), "student.cpu_kernels"), m);
  try {
    parse_option<CpuKernels>("avx2", "student.cpu_kernels");
    FAIL() << "accepted avx2";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("student.cpu_kernels"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"avx2\""), std::string::npos) << e.what();
  }
}

TEST(CpuKernelChoice, ShapeClassRoundsRowsUpToAPowerOfTwoAndKeepsWidthsAndThreads) {
  const StepShape a = shape_class(FusedStep::kRmsNorm, 8 * 255, {256, 0, 0, 0}, 2);
  EXPECT_EQ(a.rows, 2048);
  EXPECT_EQ(a.dims[0], 256);
  EXPECT_EQ(a.threads, 2);
  EXPECT_EQ(shape_class(FusedStep::kRmsNorm, 2048, {256, 0, 0, 0}, 2).rows, 2048);
  EXPECT_EQ(shape_class(FusedStep::kRmsNorm, 2049, {256, 0, 0, 0}, 2).rows, 4096);
  EXPECT_EQ(shape_class(FusedStep::kRmsNorm, 1, {256, 0, 0, 0}, 2).rows, 1);
  // Same rows class, same widths, same threads: one key; any difference: another.
  const StepShape b = shape_class(FusedStep::kRmsNorm, 2048, {256, 0, 0, 0}, 2);
  EXPECT_FALSE(a < b || b < a);
  for (const StepShape& other : {shape_class(FusedStep::kSwiGluMlp, 2048, {256, 0, 0, 0}, 2),
                                 shape_class(FusedStep::kRmsNorm, 2048, {128, 0, 0, 0}, 2),
                                 shape_class(FusedStep::kRmsNorm, 2048, {256, 0, 0, 0}, 4),
                                 shape_class(FusedStep::kRmsNorm, 1024, {256, 0, 0, 0}, 2)})
    EXPECT_TRUE(a < other || other < a);
}

TEST(CpuKernelChoice, CalibrationRowsStayNearFourGigaflopButNeverUnder64) {
  // The examples of cpu_kernel_choice.h.
  EXPECT_EQ(calibration_rows(2048, 12.0 * 256 * 768), 1695);  // 4e9 / 2359296 = 1695.4
  EXPECT_EQ(calibration_rows(2048, 12.0 * 256), 2048);
  EXPECT_EQ(calibration_rows(1 << 19, 12.0 * 4096 * 12288), 64);
  EXPECT_EQ(calibration_rows(10, 12.0 * 4096 * 12288), 10);  // never more rows than the step has
}

TEST(CpuKernelChoice, FusedRunsOnlyWhenItsMedianIsBelowTheOpSequences) {
  EXPECT_TRUE(fused_is_faster({1.0, 0.9, 5.0}, {1.2, 1.1, 1.3}));  // an outlier does not decide
  EXPECT_FALSE(fused_is_faster({1.2, 1.1, 1.3}, {1.0, 0.9, 5.0}));
  EXPECT_FALSE(fused_is_faster({1.0, 1.0, 1.0}, {1.0, 1.0, 1.0}));  // a tie goes to the ops
}

// Stand-in steps: one sleeps (slow), the other returns at once; each counts its calls.
struct Steps {
  int fused_calls = 0, ops_calls = 0;
  CpuKernelCalibration::Timed fused(bool slow) {
    return [this, slow] { ++fused_calls; if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
  }
  CpuKernelCalibration::Timed ops(bool slow) {
    return [this, slow] { ++ops_calls; if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
  }
};

TEST(CpuKernelChoice, FusedAndAtenModesNeverTimeAnything) {
  CpuKernelCalibration cal;
  Steps s;
  const StepShape shape = shape_class(FusedStep::kSwiGluMlp, 64, {16, 48, 0, 0}, 1);
  EXPECT_TRUE(cal.use_fused(CpuKernels::kFused, shape, 64, s.fused(true), s.ops(false)));
  EXPECT_FALSE(cal.use_fused(CpuKernels::kAten, shape, 64, s.fused(false), s.ops(true)));
  EXPECT_EQ(s.fused_calls + s.ops_calls, 0);
  EXPECT_TRUE(cal.measurements().empty());
}

TEST(CpuKernelChoice, AutoPicksTheFasterPathOncePerShapeClass) {
  CpuKernelCalibration cal;
  cal.reps = 3;
  const StepShape fused_wins = shape_class(FusedStep::kRmsNorm, 2048, {256, 0, 0, 0}, 2);
  const StepShape ops_win = shape_class(FusedStep::kRmsNorm, 2048, {64, 0, 0, 0}, 2);
  Steps a, b;
  EXPECT_TRUE(cal.use_fused(CpuKernels::kAuto, fused_wins, 2048, a.fused(false), a.ops(true)));
  EXPECT_FALSE(cal.use_fused(CpuKernels::kAuto, ops_win, 2048, b.fused(true), b.ops(false)));
  // One untimed warm-up, then reps timed calls, of each.
  EXPECT_EQ(a.fused_calls, 4);
  EXPECT_EQ(a.ops_calls, 4);
  // Cached: the same class (2040 rows rounds to 2048) answers without timing, even when the
  // stand-ins would now say otherwise.
  Steps again;
  EXPECT_TRUE(cal.use_fused(CpuKernels::kAuto, shape_class(FusedStep::kRmsNorm, 2040, {256, 0, 0, 0}, 2), 2040,
                            again.fused(true), again.ops(false)));
  EXPECT_EQ(again.fused_calls + again.ops_calls, 0);
  const auto m = cal.measurements();
  ASSERT_EQ(m.size(), 2u);
  for (const StepCalibration& c : m) {
    EXPECT_EQ(c.calibration_rows, 2048);
    const double slow = c.fused ? c.ops_ms : c.fused_ms, fast = c.fused ? c.fused_ms : c.ops_ms;
    EXPECT_GE(slow, 3.0);  // slept 3 ms
    EXPECT_LT(fast, slow);
  }
}

// A resumed run is a new process whose timings may disagree with the first one's: it must take the
// recorded decisions (the same rounding as the run it continues), not time again.
TEST(CpuKernelChoice, AResumedProcessTakesTheRecordedDecisionsInsteadOfTimingAgain) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("deepen_cpu_kernels_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "cpu_kernels" / "rank3.json").string();
  const StepShape fused_won = shape_class(FusedStep::kSwiGluMlp, 2048, {256, 768, 0, 0}, 2);
  const StepShape ops_won = shape_class(FusedStep::kRmsNorm, 2048, {64, 0, 0, 0}, 2);
  {
    CpuKernelCalibration first;  // the first process: times, and writes each decision as it makes it
    first.reps = 3;
    first.record_to(path, /*reuse=*/true);  // nothing recorded yet: an empty record
    Steps a, b;
    EXPECT_TRUE(first.use_fused(CpuKernels::kAuto, fused_won, 2048, a.fused(false), a.ops(true)));
    EXPECT_FALSE(first.use_fused(CpuKernels::kAuto, ops_won, 2048, b.fused(true), b.ops(false)));
  }
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // The resumed process: its stand-ins now say the opposite; the record wins and nothing is timed.
  CpuKernelCalibration resumed;
  resumed.record_to(path, /*reuse=*/true);
  Steps s;
  EXPECT_TRUE(resumed.use_fused(CpuKernels::kAuto, fused_won, 2048, s.fused(true), s.ops(false)));
  EXPECT_FALSE(resumed.use_fused(CpuKernels::kAuto, ops_won, 2048, s.fused(false), s.ops(true)));
  EXPECT_EQ(s.fused_calls + s.ops_calls, 0);
  // A shape the first process never saw is timed (and added to the record).
  const StepShape fresh_shape = shape_class(FusedStep::kQkvRope, 2048, {256, 4, 2, 64}, 2);
  EXPECT_TRUE(resumed.use_fused(CpuKernels::kAuto, fresh_shape, 2048, s.fused(false), s.ops(true)));
  EXPECT_GT(s.fused_calls, 0);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(CpuKernelCalibration::from_json(text, path).size(), 3u);

  // --fresh (reuse = false): the old record is not taken; the stand-ins decide.
  CpuKernelCalibration fresh;
  fresh.reps = 3;
  fresh.record_to(path, /*reuse=*/false);
  Steps f;
  EXPECT_FALSE(fresh.use_fused(CpuKernels::kAuto, fused_won, 2048, f.fused(true), f.ops(false)));
  fs::remove_all(dir);
}

TEST(CpuKernelChoice, ABrokenRecordIsAnErrorNamingTheFile) {
  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() / ("deepen_cpu_kernels_bad_" + std::to_string(::getpid()) + ".json");
  for (const std::string& text : {std::string("{\"version\":1,\"decisions\":[{\"step\":\"rms_no"),
                                  std::string("{\"version\":2,\"decisions\":[]}"),
                                  std::string("{\"version\":1,\"decisions\":[{\"step\":\"softmax\",\"rows\":1,"
                                              "\"dims\":[1,0,0,0],\"threads\":1,\"fused\":true}]}")}) {
    std::ofstream(path) << text;
    CpuKernelCalibration cal;
    try {
      cal.record_to(path.string(), true);
      ADD_FAILURE() << "accepted " << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
  fs::remove(path);
}

}  // namespace
}  // namespace deepen
