// JSONL records: one rule for a torn last line (dropped, with a warning) and a bad line in the
// middle (an error naming file and line), for every reader; the resume rewrite; live progress.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "run_folder/jsonl.h"
#include "run_folder/run_folder.h"
#include "run_folder/run_records.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::string write(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

std::vector<int64_t> steps(const std::vector<nlohmann::json>& records) {
  std::vector<int64_t> out;
  for (const auto& r : records) out.push_back(r.at("step").get<int64_t>());
  return out;
}

TEST(Jsonl, ATornLastLineIsDroppedWithAWarningNamingFileAndLine) {
  const fs::path dir = test::scratch_dir("jsonl", "torn");
  // What a kill mid-write leaves: the last record cut short, no newline.
  const std::string path = write(dir, "metrics.jsonl", "{\"step\":0}\n{\"step\":1}\n{\"step\":2,\"loss\":1.2");
  testing::internal::CaptureStderr();
  const auto records = read_jsonl(path);
  const std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(steps(records), (std::vector<int64_t>{0, 1}));
  EXPECT_NE(warning.find(path + ":3: dropped a torn last line"), std::string::npos) << warning;
}

TEST(Jsonl, AWholeLastRecordWithoutItsNewlineIsKept) {
  const fs::path dir = test::scratch_dir("jsonl", "no_newline");
  const std::string path = write(dir, "eval.jsonl", "{\"step\":0}\n{\"step\":1}");
  EXPECT_EQ(steps(read_jsonl(path)), (std::vector<int64_t>{0, 1}));
}

TEST(Jsonl, ABadLineInTheMiddleIsAnErrorNamingFileAndLine) {
  const fs::path dir = test::scratch_dir("jsonl", "middle");
  const std::string path = write(dir, "metrics.jsonl", "{\"step\":0}\n{\"step\":1,\"lo\n{\"step\":2}\n");
  const std::string e = test::error_of([&] { read_jsonl(path); });
  EXPECT_EQ(e.rfind(path + ":2: not JSON", 0), 0u) << e;
  // A complete last line that is not JSON was not torn by a kill (the newline comes last): an error too.
  const std::string last = write(dir, "last.jsonl", "{\"step\":0}\nnot json\n");
  EXPECT_EQ(test::error_of([&] { read_jsonl(last); }).rfind(last + ":2: not JSON", 0), 0u);
}

TEST(Jsonl, MissingFileAndBlankLinesHaveNoRecords) {
  const fs::path dir = test::scratch_dir("jsonl", "missing");
  EXPECT_TRUE(read_jsonl((dir / "none.jsonl").string()).empty());
  EXPECT_EQ(steps(read_jsonl(write(dir, "blank.jsonl", "\n{\"step\":4}\n\n"))), (std::vector<int64_t>{4}));
}

TEST(Jsonl, ResumeDropsLaterStepsAndTheTornLineSoAppendsStartOnAFreshLine) {
  const fs::path dir = test::scratch_dir("jsonl", "resume");
  const RunFolder run(dir.string());
  write(dir, "metrics.jsonl", "{\"step\":0}\n{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"lo");
  testing::internal::CaptureStderr();
  {
    RunRecords records(dir.string(), int64_t{1});  // the checkpoint after step 1
    records.metrics({{"step", 2}, {"again", true}});
  }
  testing::internal::GetCapturedStderr();
  const auto records = read_jsonl(run.metrics_jsonl());
  EXPECT_EQ(steps(records), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(records.back().value("again", false));
  // A fresh run starts fresh records.
  { RunRecords fresh(dir.string(), std::nullopt); }
  EXPECT_TRUE(read_jsonl(run.metrics_jsonl()).empty());
}

TEST(Jsonl, LiveProgressReadsTheLastCompleteRecordSilently) {
  const fs::path dir = test::scratch_dir("jsonl", "live");
  const std::string path = write(dir, "metrics.jsonl", "{\"step\":0}\n{\"step\":1}\n{\"step\":2,\"lo");
  testing::internal::CaptureStderr();
  const auto last = last_jsonl_record(path);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->at("step").get<int64_t>(), 1);
  EXPECT_FALSE(last_jsonl_record((dir / "none.jsonl").string()).has_value());
}

}  // namespace
}  // namespace deepen
