// Faults in whole single-process jobs: divergence (the guard stops, skips or rolls back), a full disk
// during records and checkpoints, every checkpoint corrupt, changed shard tokens, an early SIGTERM.
// Each says what the user sees: the exit code, the message, and what is left in the run folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "config/config.h"
#include "config/input_error.h"
#include "launch/local_job.h"
#include "model/tensor_bridge.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/progress.h"
#include "run_folder/jsonl.h"
#include "tests/control/control_test_util.h"
#include "tests/launch/tiny_world.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

using test::TinyWorld;
using test::quiet;

std::vector<nlohmann::json> records(const fs::path& run, const char* file) {
  return read_jsonl((run / file).string());
}

// DEEPEN_FAULT_NAN=<student>:<step> for the scope (launch/fault_injection.h): that student's
// teacher targets are NaN at that step, so its loss is.
struct NanAt {
  explicit NanAt(const char* spec) { ::setenv("DEEPEN_FAULT_NAN", spec, 1); }
  ~NanAt() { ::unsetenv("DEEPEN_FAULT_NAN"); }
};

// The ExitError a job throws (code and message); {0, ""} when it returns.
std::pair<int, std::string> exit_of(const std::function<int()>& job) {
  try {
    return {job(), ""};
  } catch (const ExitError& e) {
    return {e.code(), e.what()};
  }
}

std::vector<std::string> checkpoint_names(const fs::path& run) {
  std::vector<std::string> out;
  if (!fs::exists(run / "checkpoints")) return out;
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every tensor of every safetensors file under `dir` is finite.
void expect_all_finite(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    for (const auto& [name, t] : read_tensors(e.path().string()))
      if (t.is_floating_point()) EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << e.path() << ": " << name;
  }
}

// A NaN loss at step 4 (checkpoints after steps 1 and 3): the run stops with exit code 4 naming the
// step, the student, the quantity and the last good checkpoint; nothing after step 3 is written;
// resumed with a lower LR, it continues from that checkpoint to the end.
TEST(TrainerFaults, ANanLossStopsTheRunNamingItAndAResumeWithALowerLrFinishes) {
  TinyWorld world;
  const fs::path run = world.dir("nan");
  {
    NanAt nan("0:4");
    const auto [code, message] = exit_of([&] { return run_train_job(world.config("nan"), quiet()); });
    EXPECT_EQ(code, kExitDiverged) << message;
    EXPECT_NE(message.find("guard: step 4: the loss is nan on student 0 (world rank 0)"), std::string::npos) << message;
    EXPECT_NE(message.find("Last good checkpoint: " + (run / "checkpoints" / "step_00000003").string() + " (after step 3)"),
              std::string::npos) << message;
    EXPECT_NE(message.find("guard.lr_scale"), std::string::npos) << message;
  }
  EXPECT_EQ(records(run, "metrics.jsonl").size(), 4u);
  EXPECT_EQ(checkpoint_names(run), (std::vector<std::string>{"step_00000001", "step_00000003"}));
  EXPECT_FALSE(fs::exists(run / "final"));
  expect_all_finite(run);
  const auto events = records(run, "guard.jsonl");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["event"], "stopped");
  EXPECT_EQ(events[0]["step"], 4);
  EXPECT_EQ(events[0]["loss"], "nan");

  ASSERT_EQ(run_train_job(world.config("nan", {"guard.lr_scale=0.5"}), quiet()), kExitOk);
  ASSERT_EQ(run_train_job(world.config("whole"), quiet()), kExitOk);
  const auto resumed = records(run, "metrics.jsonl"), whole = records(world.dir("whole"), "metrics.jsonl");
  ASSERT_EQ(resumed.size(), 9u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i]["loss"].get<double>(), whole[i]["loss"].get<double>()) << i;
  for (size_t i = 4; i < 9; ++i)
    EXPECT_DOUBLE_EQ(resumed[i]["lr"].get<double>(), 0.5 * whole[i]["lr"].get<double>()) << "step " << i;
  EXPECT_TRUE(fs::exists(run / "final" / "student.safetensors"));
  expect_all_finite(run);
}

// The first bug: an LR far too large trained to NaN and wrote NaN checkpoints, a NaN final
// student and export, with exit 0. Now the run stops at the first non-finite step.
TEST(TrainerFaults, AnLrThatDivergesStopsTheRunBeforeAnyNonFiniteWeightIsWritten) {
  TinyWorld world;
  const fs::path run = world.dir("lr");
  const auto [code, message] = exit_of([&] { return run_train_job(world.config("lr", {"optim.lr=1e30"}), quiet()); });
  EXPECT_EQ(code, kExitDiverged) << message;
  std::cout << "deepen said: " << message << "\n";
  EXPECT_NE(message.find("guard: "), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(run / "final"));
  for (const auto& r : records(run, "metrics.jsonl")) EXPECT_TRUE(r["loss"].is_number()) << r.dump();
  expect_all_finite(run);
}

TEST(TrainerFaults, TheSkipActionDropsTheStepsUpdateRecordsItAndFinishes) {
  TinyWorld world;
  const fs::path run = world.dir("skip");
  {
    NanAt nan("0:4");
    ASSERT_EQ(run_train_job(world.config("skip", {"guard.action=\"skip\""}), quiet()), kExitOk);
  }
  std::vector<int64_t> steps;
  for (const auto& r : records(run, "metrics.jsonl")) steps.push_back(r["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 5, 6, 7, 8}));
  const auto events = records(run, "guard.jsonl");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["event"], "skipped");
  EXPECT_EQ(events[0]["step"], 4);
  expect_all_finite(run);
}

// guard.action = "rollback": exit code 5 (the Slurm scripts requeue on it) with the lowered LR
// scale in guard.jsonl; the next start resumes with it from the newest checkpoint taken before the
// update that made step 4's weights: the one after step 1, not the one after step 3 (resuming there
// would replay step 4's loss as it was: a lower LR changes only later updates). The checkpoint after
// step 3, on the trajectory that diverged, is removed.
TEST(TrainerFaults, TheRollbackActionEndsWithExit5AndTheNextStartTrainsOnWithALowerLr) {
  TinyWorld world;
  const fs::path run = world.dir("rollback");
  const Config cfg = world.config("rollback", {"guard.action=\"rollback\"", "guard.rollback_lr_factor=0.25"});
  {
    NanAt nan("0:4");
    const auto [code, message] = exit_of([&] { return run_train_job(cfg, quiet()); });
    EXPECT_EQ(code, kExitRollback) << message;
    EXPECT_NE(message.find("Rolling back (1 of guard.max_rollbacks = 3)"), std::string::npos) << message;
    EXPECT_NE(message.find("the next start resumes from " + (run / "checkpoints" / "step_00000001").string()),
              std::string::npos) << message;
  }
  const auto events = records(run, "guard.jsonl");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["event"], "rolled_back");
  EXPECT_EQ(events[0]["lr_scale"].get<double>(), 0.25);
  EXPECT_EQ(checkpoint_names(run), (std::vector<std::string>{"step_00000001"}));
  const double lr_before = records(run, "metrics.jsonl")[1]["lr"].get<double>();
  ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
  const auto m = records(run, "metrics.jsonl");
  ASSERT_EQ(m.size(), 9u);
  EXPECT_EQ(m[1]["lr"].get<double>(), lr_before);  // kept from the first start
  ASSERT_EQ(run_train_job(world.config("whole"), quiet()), kExitOk);
  const auto whole = records(world.dir("whole"), "metrics.jsonl");
  for (size_t step : {2, 3, 4})
    EXPECT_DOUBLE_EQ(m[step]["lr"].get<double>(), 0.25 * whole[step]["lr"].get<double>()) << "step " << step;
}

// A rollback needs a checkpoint from before the update that led to the bad step: with only the one
// right before it, resuming would repeat the step as it was, so the guard stops instead (exit 4).
TEST(TrainerFaults, ARollbackWithoutAnEarlierCheckpointStopsInsteadOfLooping) {
  TinyWorld world;
  const Config cfg = world.config("rollback_late", {"guard.action=\"rollback\"", "checkpoint.every=3"});
  NanAt nan("0:3");
  const auto [code, message] = exit_of([&] { return run_train_job(cfg, quiet()); });
  EXPECT_EQ(code, kExitDiverged) << message;
  EXPECT_NE(message.find("no checkpoint was taken before step 2's update"), std::string::npos) << message;
}

// A run is finished once its final/ is whole, not when the last checkpoint is written: an export
// that fails (here: a file where final/ should be) leaves the run unfinished, so a study runs it
// again; the next start resumes after the last step and writes final/.
TEST(TrainerFaults, ARunIsFinishedOnlyOnceItsFinalFolderIsWritten) {
  TinyWorld world;
  const fs::path run = world.dir("final");
  const Config cfg = world.config("final");
  JobOptions stop = quiet();
  stop.stop_after_steps = 8;
  ASSERT_EQ(run_train_job(cfg, stop), kExitRequeue);
  std::ofstream(run / "final") << "not a folder\n";
  std::string why;
  try {
    run_train_job(cfg, quiet());
  } catch (const std::exception& e) {
    why = e.what();
  }
  EXPECT_NE(why.find((run / "final").string()), std::string::npos) << why;
  EXPECT_EQ(records(run, "metrics.jsonl").size(), 9u) << "the last step trained";
  EXPECT_FALSE(read_active_layer_tokens(run.string()).complete) << "no final/: not complete";
  EXPECT_NE(job_state(run.string()), JobState::kFinished);
  fs::remove(run / "final");
  ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
  EXPECT_TRUE(fs::exists(run / "final" / "student.safetensors"));
  EXPECT_TRUE(fs::exists(run / "final" / "hf" / "config.json"));
  EXPECT_TRUE(read_active_layer_tokens(run.string()).complete);
  EXPECT_EQ(job_state(run.string()), JobState::kFinished);
  EXPECT_EQ(records(run, "metrics.jsonl").size(), 9u) << "the resume trained nothing again";
}

// The divergence guard's spike window restarts at each phase start: a growth step's loss may jump
// past guard.spike_factor x the last phase's median without being a divergence.
TEST(TrainerFaults, AGrowthStepIsNotTakenForALossSpike) {
  TinyWorld world;
  const fs::path run = world.dir("spike");
  // Any loss above the window's median would trip (factor just over 1; window of 2 steps).
  ASSERT_EQ(run_train_job(world.config("spike", {"guard.spike_factor=1.0001", "guard.spike_window=2",
                                                 "guard.action=\"skip\"", "curriculum.grow_init=\"random\""}),
                          quiet()),
            kExitOk);
  for (const auto& e : records(run, "guard.jsonl"))
    EXPECT_TRUE(e["step"] != 3 && e["step"] != 6) << "a growth step was skipped as a spike: " << e.dump();
  EXPECT_EQ(records(run, "metrics.jsonl").size() + records(run, "guard.jsonl").size(), 9u);
}

// The fourth bug: with every checkpoint's student file truncated, a resume warned, started
// over at step 0 and rewrote the records. Now it is refused, and the folder is left as it was.
TEST(TrainerFaults, EveryCheckpointCorruptRefusesTheResumeAndKeepsTheRunsHistory) {
  TinyWorld world;
  const fs::path run = world.dir("corrupt");
  JobOptions stop = quiet();
  stop.stop_after_steps = 4;
  ASSERT_EQ(run_train_job(world.config("corrupt"), stop), kExitRequeue);
  for (const std::string& name : checkpoint_names(run)) fs::resize_file(run / "checkpoints" / name / "student.safetensors", 100);
  const std::string metrics_before = test::TestProcess::slurp((run / "metrics.jsonl").string());
  testing::internal::CaptureStderr();
  const std::string why = test::error_of([&] { run_train_job(world.config("corrupt"), quiet()); });
  testing::internal::GetCapturedStderr();
  EXPECT_NE(why.find(run.string() + ": cannot resume: none of its 2 checkpoints is valid"), std::string::npos) << why;
  EXPECT_NE(why.find("metrics.jsonl (4 records)"), std::string::npos) << why;
  EXPECT_NE(why.find("--fresh"), std::string::npos) << why;
  EXPECT_EQ(test::TestProcess::slurp((run / "metrics.jsonl").string()), metrics_before);
  EXPECT_EQ(checkpoint_names(run).size(), 2u);
  JobOptions fresh = quiet();
  fresh.resume = false;
  EXPECT_EQ(run_train_job(world.config("corrupt"), fresh), kExitOk);
}

// A train shard whose token ids were changed (still inside the vocabulary): refused at start, before
// the run folder exists.
TEST(TrainerFaults, AShardWithChangedTokensIsRefusedBeforeTheRunFolderIsMade) {
  TinyWorld world;
  const Config cfg = world.config("shard");
  const std::string shard = cfg.data.train + "/00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64 + 2 * 1000);
    char id[2];
    f.read(id, 2);
    id[0] ^= 1;  // byte ids: another byte
    f.seekp(64 + 2 * 1000);
    f.write(id, 2);
  }
  const std::string why = test::error_of([&] { run_train_job(cfg, quiet()); });
  EXPECT_NE(why.find(shard + ": payload hash mismatch"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(world.dir("shard")));
}

// `deepen train` under a file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as a full
// disk fails with ENOSPC). Returns the exit code; stderr in `err`.
int train_with_file_limit(const TinyWorld& world, const std::string& name, int kib, const std::vector<std::string>& sets,
                          std::string& err) {
  const Config cfg = world.config(name, sets);
  const fs::path toml = world.dir(name).string() + ".toml";
  std::ofstream(toml) << to_toml(cfg);
  test::TestProcess job({"/bin/bash", "-c", "trap '' XFSZ; ulimit -f " + std::to_string(kib) + "; exec \"$0\" \"$@\"",
                         test::kDeepenBin, "train", toml.string(), "--quiet"},
                        {}, name);
  const auto code = job.wait_exit(300);
  err = job.err();
  return code.value_or(-1);
}

// The line the user reads last: deepen's error, as main printed it.
std::string last_error_line(const std::string& err) {
  const size_t at = err.rfind("deepen: error: ");
  return at == std::string::npos ? "" : err.substr(at, err.find('\n', at) - at);
}

// Every record file under `run` ends on a whole record (no torn line) and parses.
void expect_whole_records(const fs::path& run) {
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    if (e.path().extension() != ".jsonl" || fs::file_size(e.path()) == 0) continue;
    const std::string text = test::TestProcess::slurp(e.path().string());
    EXPECT_EQ(text.back(), '\n') << e.path();
    testing::internal::CaptureStderr();
    EXPECT_NO_THROW(read_jsonl(e.path().string())) << e.path();
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << e.path();
  }
}

// The third bug: with the disk full while records are written, the run finished with exit 0
// and 9 of 300 records. Now the first failed write stops it, naming the file and the OS's reason.
TEST(TrainerFaults, ADiskFullDuringRecordsStopsTheRunNamingTheFile) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  TinyWorld world;
  std::string err;
  // No checkpoint before the end: the records fill the limit first.
  const int code = train_with_file_limit(world, "records_full", 12,
                                         {"curriculum.stage_steps=[40, 40, 40]", "checkpoint.every=0"}, err);
  EXPECT_EQ(code, kExitFailure) << err;
  std::cout << "deepen said: " << last_error_line(err) << "\n";
  EXPECT_NE(last_error_line(err).find("records could not be written"), std::string::npos) << err;
  EXPECT_NE(err.find(".jsonl: cannot append"), std::string::npos) << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  const fs::path run = world.dir("records_full");
  EXPECT_FALSE(fs::exists(run / "final"));
  EXPECT_LT(records(run, "metrics.jsonl").size(), 120u);
  expect_whole_records(run);
}

TEST(TrainerFaults, ADiskFullDuringACheckpointStopsTheRunAndLeavesNoHalfCheckpoint) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  TinyWorld world;
  std::string err;
  const int code = train_with_file_limit(world, "checkpoint_full", 16, {}, err);
  EXPECT_EQ(code, kExitFailure) << err;
  std::cout << "deepen said: " << last_error_line(err) << "\n";
  EXPECT_NE(last_error_line(err).find("checkpoint after step 1"), std::string::npos) << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  const fs::path run = world.dir("checkpoint_full");
  EXPECT_EQ(checkpoint_names(run), std::vector<std::string>{}) << "no checkpoint, and no temporary folder";
  EXPECT_FALSE(fs::exists(run / "final"));
  expect_whole_records(run);
}

// Whether `pid` catches `sig` (/proc/PID/status, SigCgt: a hex mask, bit sig - 1).
bool catches(pid_t pid, int sig) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  return false;
}

// SIGTERM a tenth of a second after `deepen train` starts its own code, while LibTorch's
// initializers still run: before, the rank died of it (exit 143); now the signal is kept from the
// executable's first instruction (.preinit_array, before any library's initializer) and becomes a
// coordinated stop (exit 3). When it lands is up to the machine; every moment must give exit 3.
// The clock starts once the handler is in place, not at the spawn: before it, the dynamic loader
// maps and relocates LibTorch, which no code of the executable's can cover (over 0.1 s on a loaded
// machine; docs/cluster.md).
TEST(TrainerFaults, SigtermATenthOfASecondAfterStartIsACoordinatedStop) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  TinyWorld world;
  const Config cfg = world.config("early", {"curriculum.stage_steps=[3000, 3000, 3000]"});
  const fs::path toml = world.dir("early").string() + ".toml";
  std::ofstream(toml) << to_toml(cfg);
  test::TestProcess job({test::kDeepenBin, "train", toml.string(), "--quiet"}, {}, "early_sigterm");
  const auto spawned = std::chrono::steady_clock::now();
  while (!catches(job.pid(), SIGTERM) && std::chrono::steady_clock::now() - spawned < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  ASSERT_TRUE(catches(job.pid(), SIGTERM)) << "deepen never installed its SIGTERM handler\n" << job.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  job.signal(SIGTERM);
  const auto code = job.wait_exit(120);
  ASSERT_TRUE(code.has_value()) << job.err();
  EXPECT_EQ(*code, kExitRequeue) << "143 = killed by SIGTERM\n" << job.err();
}

}  // namespace
}  // namespace deepen
