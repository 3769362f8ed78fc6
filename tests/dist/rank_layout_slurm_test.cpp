// Slurm environment: host-list expansion and task identity from a fake SLURM_* environment.
#include <gtest/gtest.h>

#include "config/input_error.h"
#include "dist/slurm_env.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

using Hosts = std::vector<std::string>;

TEST(SlurmNodelist, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_nodelist("gpu[01-03,07],cpu5"), (Hosts{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"}));
  EXPECT_EQ(expand_nodelist("n[8-10]"), (Hosts{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_nodelist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_nodelist("single"), (Hosts{"single"}));
  EXPECT_EQ(expand_nodelist("a[1-2]-ib,b[3]"), (Hosts{"a1-ib", "a2-ib", "b3"}));
  EXPECT_EQ(expand_nodelist("r[1-2]-n[1-2]"), (Hosts{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
}

TEST(SlurmNodelist, RejectsMalformedListsNamingTheVariable) {
  for (const char* bad : {"gpu[01-03", "gpu01]", "gpu[3-1]", "gpu[a-b]", "gpu[1,]", "a,,b", "", "x[]"}) {
    try {
      expand_nodelist(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
}

std::map<std::string, std::string> fake_env() {
  return {{"SLURM_PROCID", "5"},  {"SLURM_NTASKS", "8"},           {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},  {"SLURM_JOB_NODELIST", "gpu[01-02]"}, {"SLURM_JOB_ID", "4242"},
          {"HOME", "/root"}};
}

TEST(SlurmEnv, ReadsRankNodeAndCoordinator) {
  const auto s = parse_slurm_env(fake_env());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->node_id, 1);
  EXPECT_EQ(s->nodes, (Hosts{"gpu01", "gpu02"}));
  EXPECT_EQ(s->nodes[s->node_id], "gpu02");
  EXPECT_EQ(s->coordinator_host, "gpu01");
  EXPECT_EQ(s->job_id, "4242");
}

TEST(SlurmEnv, AbsentWithoutSrun) {
  EXPECT_FALSE(parse_slurm_env({{"HOME", "/root"}}).has_value());
}

TEST(SlurmEnv, OlderVariableNamesAreAccepted) {
  auto env = fake_env();
  env.erase("SLURM_NTASKS");
  env.erase("SLURM_JOB_NODELIST");
  env["SLURM_NPROCS"] = "8";
  env["SLURM_NODELIST"] = "c[1-2]";
  const auto s = parse_slurm_env(env);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->coordinator_host, "c1");
}

std::string error_of(const std::map<std::string, std::string>& env) {
  return test::error_of([&] { parse_slurm_env(env); });
}

TEST(SlurmEnv, InconsistentOrMissingVariablesAreNamed) {
  auto env = fake_env();
  env["SLURM_PROCID"] = "8";
  EXPECT_NE(error_of(env).find("SLURM_PROCID=8 is not below SLURM_NTASKS=8"), std::string::npos);
  env = fake_env();
  env["SLURM_NODEID"] = "2";
  EXPECT_NE(error_of(env).find("SLURM_NODEID=2"), std::string::npos);
  env = fake_env();
  env["SLURM_LOCALID"] = "one";
  EXPECT_NE(error_of(env).find("SLURM_LOCALID"), std::string::npos);
  env = fake_env();
  env.erase("SLURM_LOCALID");
  EXPECT_NE(error_of(env).find("SLURM_LOCALID: not set"), std::string::npos);
  env = fake_env();
  env["SLURM_JOB_NODELIST"] = "gpu[01-02";
  EXPECT_NE(error_of(env).find("SLURM_JOB_NODELIST"), std::string::npos);
}

}  // namespace
}  // namespace deepen
