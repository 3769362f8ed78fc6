// CheckpointStore: atomic writes, keep-last-K, and fallback past corrupt or half-written checkpoints.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "run_folder/checkpoint_store.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("deepen_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

auto payload(const std::string& text) {
  return [text](const std::string& dir) { write_file(fs::path(dir) / "state.txt", text); };
}

TEST(CheckpointStore, KeepsTheNewestKAndReturnsTheLatest) {
  TempDir tmp;
  CheckpointStore store(tmp.path.string(), 2);
  for (int step : {10, 20, 30}) store.save(step, 7, payload("at " + std::to_string(step)));
  EXPECT_EQ(store.list().size(), 2u);
  auto found = store.latest_valid();
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 30);
  EXPECT_EQ(found->config_hash, 7u);
  EXPECT_EQ(read_file(fs::path(found->dir) / "state.txt"), "at 30");
}

TEST(CheckpointStore, TruncatedNewestFallsBackToThePreviousOne) {
  TempDir tmp;
  CheckpointStore store(tmp.path.string(), 3);
  store.save(10, 1, payload("ten"));
  const std::string newest = store.save(20, 1, payload("twenty twenty"));
  fs::resize_file(fs::path(newest) / "state.txt", 3);
  testing::internal::CaptureStderr();
  auto found = store.latest_valid();
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 10);
  EXPECT_NE(err.find("step_00000020 is corrupt"), std::string::npos) << err;
  EXPECT_NE(err.find("falling back"), std::string::npos) << err;
}

TEST(CheckpointStore, BitFlipIsDetected) {
  TempDir tmp;
  CheckpointStore store(tmp.path.string(), 3);
  store.save(10, 1, payload("ten"));
  const std::string newest = store.save(20, 1, payload("twenty"));
  {
    std::fstream f(fs::path(newest) / "state.txt", std::ios::in | std::ios::out | std::ios::binary);
    char c;
    f.seekg(2);
    f.get(c);
    f.seekp(2);
    f.put(static_cast<char>(c ^ 0x10));
  }
  EXPECT_NE(CheckpointStore::verify(newest)->find("checksum mismatch"), std::string::npos);
  testing::internal::CaptureStderr();
  EXPECT_EQ(store.latest_valid()->step, 10);
  testing::internal::GetCapturedStderr();
}

TEST(CheckpointStore, FailedPayloadLeavesNoTraceAndKeepsThePrevious) {
  TempDir tmp;
  CheckpointStore store(tmp.path.string(), 3);
  store.save(10, 1, payload("ten"));
  EXPECT_THROW(store.save(20, 1, [](const std::string&) { throw std::runtime_error("boom"); }), std::runtime_error);
  EXPECT_EQ(store.list().size(), 1u);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(store.root())) ++entries;
  EXPECT_EQ(entries, 1u) << "a temp folder was left behind";
  EXPECT_EQ(store.latest_valid()->step, 10);
}

TEST(CheckpointStore, DiskFullDuringWriteNamesThePathAndKeepsThePrevious) {
  TempDir tmp;
  CheckpointStore store(tmp.path.string(), 3);
  store.save(10, 1, payload("ten"));
  // RLIMIT_FSIZE makes writes past 4 KiB fail with EFBIG, as a full disk fails with ENOSPC.
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  std::string message;
  try {
    store.save(20, 1, [](const std::string& dir) {
      const std::string path = dir + "/model.bin";
      std::ofstream out(path, std::ios::binary);
      std::string block(1 << 16, 'x');
      out.write(block.data(), block.size());
      out.flush();
      if (!out) throw std::runtime_error(path + ": write failed (disk full?)");
    });
  } catch (const std::exception& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_NE(message.find("step_00000020.tmp"), std::string::npos) << message;
  EXPECT_EQ(store.latest_valid()->step, 10);
  EXPECT_EQ(store.list().size(), 1u);
}

TEST(CheckpointStore, UnwritableRunFolderIsNamed) {
  TempDir tmp;
  write_file(tmp.path / "checkpoints", "a file where the folder should be");
  CheckpointStore store(tmp.path.string(), 3);
  try {
    store.save(10, 1, payload("ten"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((tmp.path / "checkpoints").string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepen
