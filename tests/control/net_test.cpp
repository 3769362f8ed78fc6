// Control plane over real loopback sockets, the plain case: agents connect, report and leave.
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/control/loopback_job.h"

namespace deepen::control {
namespace {

using namespace test_support;

TEST(ControlPlaneNet, AgentsConnectReportAndLeaveCleanly) {
  LocalJob job(2, 2);
  {
    Trainer t0(job.agent(0), std::chrono::milliseconds(2)), t1(job.agent(1), std::chrono::milliseconds(2));
    ASSERT_TRUE(eventually([&] { return job.step(0) > 5 && job.step(1) > 5; }, 10));
  }
  const auto ranks = job.coord->ranks();
  EXPECT_EQ(ranks[1].host, "host-1");
  EXPECT_EQ(ranks[1].role, "student 1");
  EXPECT_EQ(ranks[1].pid, ::getpid());
  EXPECT_EQ(ranks[1].state, RankState::kConnected);
  job.agent(0).shutdown(0);
  job.agent(1).shutdown(0);
  EXPECT_TRUE(job.coord->wait_all_done(5));
  EXPECT_FALSE(job.coord->aborted().has_value());
  EXPECT_FALSE(job.agent(0).aborted().has_value());
}

}  // namespace
}  // namespace deepen::control
