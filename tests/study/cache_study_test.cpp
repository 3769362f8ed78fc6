// A study with study.teacher = "cache": every run from one teacher cache made first, no teacher ranks;
// runs that would need another cache refused; on Slurm the cache's parts first, every run after them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "study/local_runner.h"
#include "study/slurm_study.h"
#include "tests/study/study_base_toml.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

const std::string kBase = std::string(test::kStudyBaseToml) + "[cache]\nsamples = 32\n";

StudySpec cache_study(const std::string& dir, const std::string& extra = "", const std::string& run_set = "") {
  std::ofstream(dir + "/base.toml") << kBase;
  std::ofstream(dir + "/study.toml") << "[study]\nname = \"c\"\nbase = \"base.toml\"\nout_dir = \"" << dir
                                     << "/out\"\nseeds = [1, 2]\nteacher = \"cache\"\ncache_parts = 3\n" << extra
                                     << "\n[[run]]\nname = \"pre-grow\"\nset = [\"student.norm=pre\"]\n"
                                     << "\n[[run]]\nname = \"post-grow\"\nset = [\"student.norm=post\"" << run_set << "]\n";
  return load_study(dir + "/study.toml");
}

TEST(CacheStudy, EveryRunTrainsFromTheOneCacheWithNoTeacherRanks) {
  const std::string dir = test::scratch_dir("cache_study", "expand").string();
  const StudyPlan plan = expand_study(cache_study(dir));
  ASSERT_TRUE(plan.cache);
  EXPECT_EQ(plan.cache->dir, dir + "/out/cache");
  EXPECT_EQ(plan.cache->config.cache.dir, dir + "/out/cache");
  EXPECT_EQ(plan.cache->config.cache.samples, 32);
  ASSERT_EQ(plan.jobs.size(), 4u);
  for (const StudyJob& j : plan.jobs) {
    EXPECT_EQ(j.config.distill.source, DistillSource::kCache) << j.id();
    EXPECT_EQ(j.config.cache.dir, plan.cache->dir) << j.id();
    EXPECT_EQ(j.world_size, 2) << j.id();  // parallel.students: the 1 x 2 teacher ranks are gone
  }
  EXPECT_TRUE(plan.groups.empty());
  LaunchContext ctx;
  ctx.deepen_exe = "/bin/deepen";
  const ProcessSpec p = cache_process(plan, ctx);
  EXPECT_EQ(p.argv.at(1), "cache");
  EXPECT_EQ(p.argv.back(), dir + "/out/cache");
  EXPECT_NE(describe_plan(plan, ctx).find("the teacher cache"), std::string::npos);
}

TEST(CacheStudy, ARunThatNeedsAnotherCacheIsRefusedNamingTheKey) {
  const std::string dir = test::scratch_dir("cache_study", "refused").string();
  const std::string e = test::error_of([&] { expand_study(cache_study(dir, "", ", \"distill.temperature=2\"")); });
  EXPECT_NE(e.find("post-grow/seed1 cannot train from the study's teacher cache: distill.temperature: 1 vs 2"),
            std::string::npos)
      << e;
  const std::string shared = test::error_of([&] { expand_study(cache_study(dir, "share_teacher = true\n")); });
  EXPECT_NE(shared.find("no teacher pass to share"), std::string::npos) << shared;
  EXPECT_EQ(cache_share_difference(load_config(dir + "/base.toml"), load_config(dir + "/base.toml", {"student.norm=post"})),
            std::nullopt);
  EXPECT_EQ(cache_share_difference(load_config(dir + "/base.toml"), load_config(dir + "/base.toml", {"data.seq_len=16"})),
            "data.seq_len: 32 vs 16");
}

TEST(CacheStudy, OnSlurmTheCachePartsGoFirstAndEveryRunWaitsForThem) {
  const std::string dir = test::scratch_dir("cache_study", "slurm").string();
  const StudyPlan plan = expand_study(cache_study(dir));
  SlurmOptions o;
  o.deepen_exe = "/opt/deepen/build/deepen";
  o.deepen_home = test::kSourceDir;
  o.workdir = dir;
  const SlurmScripts s = slurm_scripts(plan, o, dir + "/slurm");
  std::vector<std::string> lines;
  std::istringstream in(s.study_list);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] != '#') lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u + 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[4 + i].rfind("cache ", 0), 0u) << lines[4 + i];
    EXPECT_NE(lines[4 + i].find("--part " + std::to_string(i) + "/3"), std::string::npos) << lines[4 + i];
    EXPECT_NE(lines[4 + i].find("--out " + dir + "/out/cache"), std::string::npos) << lines[4 + i];
  }
  EXPECT_NE(lines[0].find("distill.source=\"cache\""), std::string::npos) << lines[0];
  EXPECT_NE(s.submit_sh.find("cache=$(submit --array=4-6 --nodes=1 --ntasks=1"), std::string::npos) << s.submit_sh;
  EXPECT_NE(s.submit_sh.find("${cache:+--dependency=afterok:$cache} --nodes=1 --ntasks=1"), std::string::npos)
      << s.submit_sh;
}

}  // namespace
}  // namespace deepen
