// The report's note of which runs trained from a teacher cache (report/cache_runs.h).
#include <gtest/gtest.h>

#include "report/cache_runs.h"

namespace deepen {
namespace {

RunData run(const std::string& name, int64_t seed, const std::vector<std::string>& sets) {
  RunData r;
  r.config = parse_config("", "<test>", sets);
  r.config.run.name = name;
  r.config.run.seed = seed;
  return r;
}

TEST(CacheRuns, OneNotePerCacheSettingNamingItsRuns) {
  const std::vector<RunData> runs = {
      run("live", 1, {}),
      run("post-grow", 1, {"distill.source=\"cache\"", "cache.dir=\"c64\"", "cache.samples=64"}),
      run("post-grow", 2, {"distill.source=\"cache\"", "cache.dir=\"c64\"", "cache.samples=64"}),
      run("top", 1, {"distill.source=\"cache\"", "cache.dir=\"c64\"", "cache.topk=64", "cache.targets=\"topk\""})};
  const std::vector<std::string> notes = cache_run_notes(runs);
  ASSERT_EQ(notes.size(), 2u);
  std::string all = notes[0] + "\n" + notes[1];
  EXPECT_NE(all.find("sampled targets, K = 64 draws per token at τ = 1 (RS-KD, unbiased)"), std::string::npos) << all;
  EXPECT_NE(all.find(": post-grow seed 1, post-grow seed 2"), std::string::npos) << all;
  EXPECT_NE(all.find("top-64 log-probabilities"), std::string::npos) << all;
  EXPECT_EQ(all.find("live"), std::string::npos) << all;
  EXPECT_TRUE(cache_run_notes({run("live", 1, {})}).empty());
}

}  // namespace
}  // namespace deepen
