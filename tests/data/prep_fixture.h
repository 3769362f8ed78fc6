// What the prep tests share: a scratch folder per test, quiet options, a run's InputError, shard contents.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/input_error.h"
#include "data/prep.h"
#include "data/token_shards.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen::test {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class PrepFixture : public ::testing::Test {
 protected:
  // root_ = <build>/testdata/<prefix><test name>, made empty.
  void make_root(const std::string& prefix) {
    root_ = std::filesystem::path(kBinaryDir) / "testdata" /
            (prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  static PrepOptions quiet(int threads = 2) {
    PrepOptions o;
    o.threads = threads;
    o.progress = 0;
    return o;
  }
  // The message of the InputError the run throws, or "" (tests/test_support.h).
  static std::string error_of(const DataConfig& c) { return test::error_of([&] { run_prep(c, quiet()); }); }
  // Every token of a folder of shards, in order.
  static std::vector<int32_t> read_all(const std::string& folder) {
    const ShardSet set = ShardSet::open(folder, 2, 0, 0);
    std::vector<int32_t> ids(size_t(set.tokens()));
    set.read(0, set.tokens(), ids.data());
    return ids;
  }
  std::filesystem::path root_;
};

}  // namespace deepen::test
