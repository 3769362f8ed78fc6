// What the run folder does when its disk or its contents fail: record writes checked, a resume that
// would start over refused, stale checkpoint temporaries removed, shards verified once per run.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "config/input_error.h"
#include "config/text_file.h"
#include "data/token_shards.h"
#include "run_folder/checkpoint_store.h"
#include "run_folder/jsonl.h"
#include "run_folder/progress.h"
#include "run_folder/run_folder.h"
#include "run_folder/verified_shards.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// /dev/full fails every write with ENOSPC, as a full disk does. Before, the stream's failure went
// unchecked: every record after it vanished and the run ended with exit 0.
TEST(RecordFaults, ARecordWriteToAFullDiskThrowsNamingTheFileAndTheReasonEveryTime) {
  JsonlWriter writer("/dev/full");
  const std::string first = message_of([&] { writer.append({{"step", 0}}); });
  EXPECT_NE(first.find("/dev/full: cannot append a record: No space left on device"), std::string::npos) << first;
  // Never written past a gap: the next append fails with the same error.
  EXPECT_EQ(message_of([&] { writer.append({{"step", 1}}); }), first);
}

TEST(RecordFaults, AFileReplacedWholeNamesItWhenItCannotBeWritten) {
  const fs::path dir = test::scratch_dir("record_faults", "replace");
  const std::string path = (dir / "missing" / "run.json").string();
  const std::string why = message_of([&] { write_file_text(path, "{}", "the run's metadata"); });
  EXPECT_NE(why.find(path + ": cannot write the run's metadata: No such file or directory"), std::string::npos) << why;
  write_file_text((dir / "run.json").string(), "{\"a\": 1}\n", "the run's metadata");
  std::ifstream in(dir / "run.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{\"a\": 1}\n");
  EXPECT_FALSE(fs::exists(dir / "run.json.tmp"));
}

// Every checkpoint corrupt: before, the trainer warned and started over at step 0, rewriting the
// records and pruning the checkpoints. Now the resume is refused, naming the folder and what it holds.
TEST(RecordFaults, AResumeWithRecordsButNoValidCheckpointIsRefusedNamingWhatWasFound) {
  const fs::path run = test::scratch_dir("record_faults", "no_valid_checkpoint");
  CheckpointStore store(run.string(), 5);
  for (int64_t step : {1, 3})
    store.save(step, 7, [](const std::string& tmp) { std::ofstream(tmp + "/student.bin") << "weights"; });
  for (const std::string& dir : store.list()) fs::resize_file(fs::path(dir) / "student.bin", 2);
  std::ofstream(RunFolder(run.string()).metrics_jsonl()) << "{\"step\":0}\n{\"step\":1}\n{\"step\":2}\n";
  testing::internal::CaptureStderr();
  const std::string why = test::error_of([&] { resume_point(run.string(), 5); });
  testing::internal::GetCapturedStderr();
  EXPECT_NE(why.find(run.string() + ": cannot resume: none of its 2 checkpoints is valid"), std::string::npos) << why;
  EXPECT_NE(why.find("student.bin: 2 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("and it holds metrics.jsonl (3 records)"), std::string::npos) << why;
  EXPECT_NE(why.find("--fresh"), std::string::npos) << why;
  EXPECT_EQ(store.list().size(), 2u);  // nothing was removed
}

TEST(RecordFaults, AFolderWithoutAnEarlierRunStartsFreshAndAValidCheckpointResumes) {
  const fs::path run = test::scratch_dir("record_faults", "resume_point");
  EXPECT_FALSE(resume_point(run.string(), 5));
  EXPECT_FALSE(resume_point((run / "not_yet").string(), 5));
  CheckpointStore(run.string(), 5).save(4, 7, [](const std::string& tmp) { std::ofstream(tmp + "/x") << "x"; });
  const auto found = resume_point(run.string(), 5);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 4);
}

// A writer killed mid-checkpoint leaves step_N.tmp-<pid>; the next start removes it once that
// process is gone, and keeps the folder of a writer that still runs.
TEST(RecordFaults, StaleCheckpointTemporariesOfDeadWritersAreRemovedAndLiveOnesKept) {
  const fs::path run = test::scratch_dir("record_faults", "stale_tmp");
  CheckpointStore store(run.string(), 5);
  store.save(1, 7, [](const std::string& tmp) { std::ofstream(tmp + "/x") << "x"; });
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);  // reaped: no process has this id now
  const fs::path root(store.root());
  const fs::path stale = root / ("step_00000003.tmp-" + std::to_string(dead));
  const fs::path live = root / ("step_00000005.tmp-" + std::to_string(::getppid()));
  const fs::path mine = root / ("step_00000007.tmp-" + std::to_string(::getpid()));
  for (const fs::path& p : {stale, live, mine}) {
    fs::create_directories(p);
    std::ofstream(p / "student.safetensors") << "half";
  }
  const std::vector<std::string> removed = store.remove_stale_temporaries();
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], stale.string());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_EQ(store.latest_valid()->step, 1);
}

// A token id changed to another valid id passes Shard::open; the run's full check finds it, and a
// shard verified once is not read again while its size, time and hash stay those recorded.
TEST(RecordFaults, AShardWhoseIdsChangedIsRefusedAndAVerifiedOneIsReadOncePerRun) {
  const fs::path dir = test::scratch_dir("record_faults", "shards");
  const std::string shard = (dir / "00000.bin").string();
  std::vector<int32_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 200);
  write_shard(shard, ids, 256, 1);
  const std::string run = (dir / "run").string();
  const ShardVerification first = verify_shards_once(run, {shard});
  EXPECT_EQ(first.verified, 1);
  record_verified_shards(run, first.stamps);
  EXPECT_EQ(verify_shards_once(run, {shard}).verified, 0);

  {  // token 100 (bytes 64 + 200) becomes 101: still inside the vocabulary
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 2 * 100);
    const char changed[2] = {101, 0};
    f.write(changed, 2);
  }
  EXPECT_NO_THROW(Shard::open(shard));
  const std::string why = test::error_of([&] { verify_shards_once(run, {shard}); });
  EXPECT_NE(why.find(shard), std::string::npos) << why;
  EXPECT_NE(why.find("payload hash mismatch"), std::string::npos) << why;
}

}  // namespace
}  // namespace deepen
