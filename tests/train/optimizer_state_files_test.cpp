// A checkpoint's optimizer shards read back: a missing shard or a parameter the shards do not
// cover is an error naming the folder or the parameter, never zeros passed off as state.
#include "train/optimizer_state_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include "model/tensor_bridge.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

// Student r of 2 owns w[2r, 2r+2) of a 4-element parameter "w".
void write_shard(const std::string& dir, int64_t r) {
  write_tensors(RunFolder::checkpoint_optimizer_shard(dir, r, 2),
                {{"w.exp_avg", at::full({2}, 1.0f + r)}, {"w.exp_avg_sq", at::full({2}, 3.0f + r)},
                 {"w.offset", at::full({1}, 2 * r, at::kLong)}, {"w.step", at::full({1}, int64_t{7}, at::kLong)}});
}

std::string error_of(const std::string& dir, const std::map<std::string, std::vector<int64_t>>& shapes) {
  try {
    read_whole_optimizer_state(dir, shapes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerStateFiles, ShardsAssembleAndAMissingOrShortShardIsNamed) {
  const std::string dir = (fs::temp_directory_path() / "deepen_optimizer_state_files_test").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_shard(dir, 0);
  EXPECT_NE(error_of(dir, {{"w", {4}}}).find(dir + ": optimizer shards are incomplete"), std::string::npos);

  write_shard(dir, 1);
  const auto state = read_whole_optimizer_state(dir, {{"w", {4}}});
  EXPECT_TRUE(at::equal(state.at("w.exp_avg"), at::tensor({1.0f, 1.0f, 2.0f, 2.0f})));
  EXPECT_TRUE(at::equal(state.at("w.exp_avg_sq"), at::tensor({3.0f, 3.0f, 4.0f, 4.0f})));
  EXPECT_EQ(state.at("w.step").item<int64_t>(), 7);

  // A parameter of 6 elements is covered for 4 only: named, not padded with zeros.
  const std::string e = error_of(dir, {{"w", {6}}});
  EXPECT_NE(e.find("the optimizer shards cover 4 of 6 elements of w"), std::string::npos) << e;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deepen
