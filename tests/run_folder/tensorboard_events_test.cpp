// TensorBoard event files: the checksum and framing, and a run's records read back by TensorBoard.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "run_folder/run_folder.h"
#include "run_folder/run_records.h"
#include "run_folder/tensorboard_events.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (RunFolder::is_tensorboard_events(e.path().filename().string())) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs tests/run_folder/tensorboard_reader.py (TensorBoard's EventAccumulator) on `dir`: its JSON, or
// nullopt when the `tensorboard` package is missing (the reader exits 77).
std::optional<nlohmann::json> tensorboard_view(const fs::path& dir, const std::string& flags = "") {
  const fs::path out = dir.parent_path() / (dir.filename().string() + flags + ".view.json");
  const std::string cmd = std::string(test::kPython) + " " + test::kSourceDir +
                          "/tests/run_folder/tensorboard_reader.py " + dir.string() + " " + flags + " > " +
                          out.string();
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 77) return std::nullopt;
  if (rc != 0) throw std::runtime_error("tensorboard_reader.py failed (rc " + std::to_string(rc) + "): " + cmd);
  return nlohmann::json::parse(slurp(out));
}

// What one of TensorBoard's readers holds for `tag`: (step, value) pairs. `reader` is "scalars" (the
// classic EventAccumulator) or "server" (the one `tensorboard --logdir` serves from).
std::vector<std::pair<int64_t, double>> series(const nlohmann::json& view, const std::string& tag,
                                               const std::string& reader = "scalars") {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& p : view.at(reader).at(tag)) out.emplace_back(p[0].get<int64_t>(), p[1].get<double>());
  return out;
}

// The value as TensorBoard stores it: simple_value is a 32-bit float.
double as_float(double x) { return static_cast<double>(static_cast<float>(x)); }

// The standard check value of CRC-32C (the "123456789" string) and the iSCSI test vectors of
// RFC 3720 (B.4): a different polynomial or a missing final xor gives other numbers.
TEST(TensorBoardEvents, Crc32cGivesTheStandardCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  // The mask is a 15-bit right rotation plus TensorFlow's constant.
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

// A TFRecord is the data between its little-endian length and two masked checksums.
TEST(TensorBoardEvents, ATfRecordFramesItsDataWithTheLengthAndMaskedChecksums) {
  const std::string data = "brain.Event:2";
  const std::string r = tfrecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  std::memcpy(&length, r.data(), 8);
  EXPECT_EQ(length, data.size());
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 12 + data.size(), 4);
  EXPECT_EQ(length_crc, masked_crc32c(std::string_view(r.data(), 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(data_crc, masked_crc32c(data));
}

// The records' numbers become scalars, nested ones by path; booleans, nulls and the step do not.
TEST(TensorBoardEvents, EveryNumericFieldOfARecordIsAScalarTaggedByItsPath) {
  const nlohmann::json record = {{"step", 7},           {"loss", 2.5},  {"tokens", 4096},
                                 {"stage_end", true},   {"val_kl", nullptr},
                                 {"time", {{"compute", 0.25}, {"eval", 0}}}};
  std::vector<std::pair<std::string, double>> got;
  for (const Scalar& s : numeric_fields(record, "train")) got.emplace_back(s.tag, s.value);
  // nlohmann::json keeps an object's keys sorted.
  const std::vector<std::pair<std::string, double>> want = {
      {"train/loss", 2.5}, {"train/time/compute", 0.25}, {"train/time/eval", 0.0}, {"train/tokens", 4096.0}};
  EXPECT_EQ(got, want);
}

nlohmann::json metrics_record(int64_t step, double loss) {
  return {{"step", step}, {"stage", step / 3}, {"loss", loss}, {"lr", 1e-4 * (step + 1)}, {"tokens", 64 * (step + 1)},
          {"time", {{"compute", 0.1}, {"eval", 0.0}}}};
}

// A run's records as TensorBoard shows them: every metrics field under train/, every eval field
// under eval/, each step once. The run is stopped after step 5 and resumed from its checkpoint
// after step 3, so steps 4 and 5 are trained twice: TensorBoard keeps the second time only (the
// resumed file's SessionLog START), as metrics.jsonl does. Then a fresh run in the same folder
// leaves none of the old event files.
TEST(TensorBoardEvents, TensorBoardReadsARunsRecordsWithTheRedoneStepsOfAResumeOnce) {
  const fs::path dir = test::scratch_dir("tensorboard", "resume");
  {
    RunRecords first(dir.string(), std::nullopt, /*tensorboard=*/true);
    for (int64_t step = 0; step <= 5; ++step) first.metrics(metrics_record(step, 1.0 + 0.1 * step));
    first.eval({{"step", 2}, {"val_ce", 3.25}, {"val_kl", 0.5}, {"stage_end", true}});
    first.eval({{"step", 5}, {"val_ce", 3.0}, {"val_kl", 0.25}, {"stage_end", false}});
  }
  {
    // Resumed within the same second: its file must still sort after the first one's.
    RunRecords resumed(dir.string(), int64_t{3}, /*tensorboard=*/true);
    for (int64_t step = 4; step <= 7; ++step) resumed.metrics(metrics_record(step, 10.0 + step));
    resumed.eval({{"step", 5}, {"val_ce", 2.75}, {"val_kl", nullptr}, {"stage_end", true}});
    resumed.eval({{"step", 7}, {"val_ce", 2.5}, {"val_kl", 0.125}, {"stage_end", true}});
  }
  ASSERT_EQ(event_files(dir).size(), 2u);
  const auto view = tensorboard_view(dir);
  if (!view) GTEST_SKIP() << "the PyPI package tensorboard is missing: pip install -r requirements.txt";
  EXPECT_EQ(view->at("files").get<int>(), 2);

  std::vector<std::pair<int64_t, double>> want_loss;
  for (int64_t step = 0; step <= 3; ++step) want_loss.emplace_back(step, as_float(1.0 + 0.1 * step));
  for (int64_t step = 4; step <= 7; ++step) want_loss.emplace_back(step, as_float(10.0 + step));
  // TensorBoard's view and metrics.jsonl agree step for step.
  const auto metrics = read_jsonl(RunFolder(dir.string()).metrics_jsonl());
  ASSERT_EQ(metrics.size(), want_loss.size());
  for (size_t i = 0; i < metrics.size(); ++i) {
    EXPECT_EQ(metrics[i]["step"].get<int64_t>(), want_loss[i].first);
    EXPECT_EQ(as_float(metrics[i]["loss"].get<double>()), want_loss[i].second);
  }
  for (const std::string reader : {"scalars", "server"}) {
    SCOPED_TRACE(reader);
    EXPECT_EQ(series(*view, "train/loss", reader), want_loss);
    EXPECT_EQ(series(*view, "train/lr", reader).back(), std::make_pair(int64_t{7}, as_float(8e-4)));
    EXPECT_EQ(series(*view, "train/tokens", reader).back(), std::make_pair(int64_t{7}, 512.0));
    EXPECT_EQ(series(*view, "train/time/compute", reader).size(), 8u);
    EXPECT_EQ(series(*view, "eval/val_ce", reader),
              (std::vector<std::pair<int64_t, double>>{{2, 3.25}, {5, 2.75}, {7, 2.5}}));
    // A null is no point: the resumed eval at step 5 has no KL, the first run's was dropped.
    EXPECT_EQ(series(*view, "eval/val_kl", reader), (std::vector<std::pair<int64_t, double>>{{2, 0.5}, {7, 0.125}}));
    EXPECT_FALSE(view->at(reader).contains("eval/stage_end"));
    EXPECT_FALSE(view->at(reader).contains("train/step"));
  }

  // Without the purge the redone steps would show twice: the test can tell.
  const auto raw = tensorboard_view(dir, "--keep-orphans");
  ASSERT_TRUE(raw.has_value());
  EXPECT_EQ(series(*raw, "train/loss").size(), 6u + 4u);
  EXPECT_EQ(series(*raw, "train/loss", "server").size(), 6u + 4u);

  { RunRecords fresh(dir.string(), std::nullopt, /*tensorboard=*/false); }
  EXPECT_TRUE(event_files(dir).empty());
}

// The file name is TensorBoard's pattern, and a new file sorts after every file already there, even
// one stamped in the future (a clock set back between two starts).
TEST(TensorBoardEvents, ANewEventFileSortsAfterTheFoldersOlderOnes) {
  const fs::path dir = test::scratch_dir("tensorboard", "names");
  const std::string future = fs::path(RunFolder(dir.string()).tensorboard_events(9999999990, "elsewhere")).filename();
  std::ofstream(dir / future) << "";
  EXPECT_EQ(RunFolder::tensorboard_events_seconds(future), int64_t{9999999990});
  EXPECT_FALSE(RunFolder::tensorboard_events_seconds("metrics.jsonl").has_value());
  const TensorBoardEvents events(dir.string(), std::nullopt);
  const std::string name = fs::path(events.path()).filename();
  EXPECT_EQ(name.rfind("events.out.tfevents.9999999991.", 0), 0u) << name;
  EXPECT_EQ(event_files(dir).back().filename(), name);
  // A fresh run's file holds the file_version event and a START at step 0, framed: only the wall
  // times differ from events made now.
  const std::string bytes = slurp(events.path());
  const std::string version = tfrecord(file_version_event(0)), start = tfrecord(session_start_event(0, 0));
  ASSERT_EQ(bytes.size(), version.size() + start.size());
  EXPECT_EQ(bytes.substr(0, 12), version.substr(0, 12));  // same length, same length checksum
  EXPECT_EQ(bytes.substr(version.size(), 12), start.substr(0, 12));
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
}

}  // namespace
}  // namespace deepen
