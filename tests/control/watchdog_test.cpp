// The watchdog over real sockets and processes: SIGKILL, SIGSTOP, a job-wide stall, a lost or frozen
// coordinator, a rank leaving by exception or with an error, a rank that never connects.
#include <signal.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>

#include "config/input_error.h"
#include "tests/control/loopback_job.h"

namespace deepen::control {
namespace {

using namespace test_support;

TEST(ControlWatchdog, KilledAgentProcessAbortsEveryOtherRankNamingRankHostAndLastStep) {
  LocalJob job(3, 2);
  Trainer t0(job.agent(0), std::chrono::milliseconds(2)), t1(job.agent(1), std::chrono::milliseconds(2));
  ChildProcess child(agent_child_env(2, 3, job.coord->endpoint(), job.secret, 2, /*idle_at=*/5), "kill9");
  ASSERT_TRUE(eventually([&] { return job.step(2) == 5; }, 15)) << child.err();
  child.signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return job.abort_of(0) && job.abort_of(1); }, 10))
      << "the other ranks were not aborted";
  for (int r : {0, 1}) {
    const AbortInfo info = *job.abort_of(r);
    EXPECT_EQ(info.rank, 2);
    EXPECT_EQ(info.host, "child-host-2");
    EXPECT_EQ(info.step, 5);
    EXPECT_NE(info.message.find("rank 2 on child-host-2"), std::string::npos) << info.message;
    EXPECT_NE(info.message.find("last step 5"), std::string::npos) << info.message;
    EXPECT_NE(info.message.find("connection lost"), std::string::npos) << info.message;
  }
  // The trainers, blocked or not, learn it at their next step boundary instead of hanging.
  ASSERT_TRUE(eventually([&] { return t0.finished && t1.finished; }, 5));
  EXPECT_NE(t0.error.find("rank 2 on child-host-2"), std::string::npos) << t0.error;
  EXPECT_EQ(child.wait_exit(5), 128 + SIGKILL);
}

TEST(ControlWatchdog, FrozenProcessAbortsTheJobAndOtherProcessesExitNonZeroWithTheMessage) {
  LocalJob job(3, 1, [](CoordinatorOptions& o) { o.watchdog_s = 1.0; });
  Trainer t0(job.agent(0), std::chrono::milliseconds(2));
  ChildProcess frozen(agent_child_env(1, 3, job.coord->endpoint(), job.secret, 2), "frozen");
  ChildProcess other(agent_child_env(2, 3, job.coord->endpoint(), job.secret, 2), "other");
  ASSERT_TRUE(eventually([&] { return job.step(1) > 3 && job.step(2) > 3; }, 15)) << frozen.err() << other.err();
  frozen.signal(SIGSTOP);  // alive, connection up, but not a single heartbeat more
  const auto code = other.wait_exit(15);
  ASSERT_TRUE(code.has_value()) << "the other process did not exit after the abort";
  // Silence with the connection open: a node lost or cut off, or a frozen process (requeued).
  EXPECT_EQ(*code, kExitUnreachable);
  const std::string err = other.err();
  EXPECT_NE(err.find("ABORT: rank 1 on child-host-1"), std::string::npos) << err;
  EXPECT_NE(err.find("no heartbeat for"), std::string::npos) << err;
  ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 5));
  EXPECT_EQ(job.abort_of(0)->rank, 1);
  frozen.signal(SIGKILL);
  EXPECT_TRUE(frozen.wait_exit(5).has_value());
}

TEST(ControlWatchdog, JobWideStallAbortsNamingTheRankThatStoppedFirst) {
  LocalJob job(2, 2, [](CoordinatorOptions& o) { o.watchdog_s = 1.0; });
  // Rank 1 hangs after 5 steps; rank 0 goes on a little (its steps keep the job "alive"), then
  // blocks on rank 1 as a collective would.
  Trainer t1(job.agent(1), std::chrono::milliseconds(2), /*freeze=*/5);
  ASSERT_TRUE(eventually([&] { return job.step(1) == 5; }, 10));
  {
    Trainer t0(job.agent(0), std::chrono::milliseconds(20), /*freeze=*/15);
    ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 15));
  }
  const AbortInfo info = *job.abort_of(0);
  EXPECT_EQ(info.rank, 1) << info.message;
  EXPECT_EQ(info.step, 5);
  EXPECT_NE(info.message.find("no rank has made progress"), std::string::npos) << info.message;
}

TEST(ControlWatchdog, LosingTheCoordinatorAbortsEveryAgent) {
  const Secret secret = generate_secret();
  CoordinatorProcess coordinator(2, secret, "coordinator");
  LogSink log;
  Agents agents(2, 2, secret, log, coordinator.endpoint);
  Trainer t0(agents[0], std::chrono::milliseconds(2)), t1(agents[1], std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few pings carry rank 0's state
  coordinator.signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return agents.abort_of(0) && agents.abort_of(1); }, 10));
  const AbortInfo info = *agents.abort_of(1);
  EXPECT_NE(info.message.find("lost the control connection to the coordinator at " + coordinator.endpoint.str()),
            std::string::npos) << info.message;
  EXPECT_EQ(info.rank, 0) << "the hosting rank named in the coordinator's pings";
  EXPECT_NE(info.message.find("rank 0 on host-0"), std::string::npos) << info.message;
}

TEST(ControlWatchdog, FrozenCoordinatorMakesAgentsAbortAfterTheWatchdogTimeout) {
  const Secret secret = generate_secret();
  CoordinatorProcess coordinator(1, secret, "frozen_coordinator");
  LogSink log;
  Agents agents(1, 1, secret, log, coordinator.endpoint, [](AgentOptions& o) { o.watchdog_s = 1.0; });
  coordinator.signal(SIGSTOP);  // its socket stays open: only the silence tells
  ASSERT_TRUE(eventually([&] { return agents.abort_of(0).has_value(); }, 10));
  EXPECT_NE(agents.abort_of(0)->message.find("silent for"), std::string::npos) << agents.abort_of(0)->message;
}

// A rank whose trainer throws leaves without shutdown(): the Agent's destructor drops the
// connection, and the others abort at once instead of waiting in a collective for it.
TEST(ControlWatchdog, AgentDestroyedWithoutShutdownAbortsTheOthers) {
  LocalJob job(2, 1);
  {
    Agent a1(fast_agent(1, 2, job.secret, job.log));
    a1.connect(job.coord->endpoint());
    a1.report(4, 0, 1);
    ASSERT_TRUE(eventually([&] { return job.step(1) == 4; }, 10));
  }
  ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 10));
  EXPECT_EQ(job.abort_of(0)->rank, 1);
  EXPECT_EQ(job.abort_of(0)->step, 4);
  EXPECT_NE(job.abort_of(0)->message.find("control connection lost"), std::string::npos) << job.abort_of(0)->message;
}

TEST(ControlWatchdog, RankLeavingWithAnErrorAbortsTheOthersWithItsMessage) {
  LocalJob job(2, 2);
  job.agent(1).report(7, 0, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  job.agent(1).shutdown(1, "CUDA error: out of memory");
  ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 10));
  EXPECT_EQ(job.abort_of(0)->message, "rank 1 on host-1 (student 1, pid " + std::to_string(::getpid()) +
                                          "), last step 7: exited with code 1: CUDA error: out of memory");
}

// The abort message quotes the rank's role and its Bye text, each within the wire's string bound but
// longer than it together: the ranks still get the abort, cut to the bound, and the coordinator
// keeps the whole sentence.
TEST(ControlWatchdog, AbortMessageLongerThanTheWireAllowsReachesTheRanksCut) {
  LocalJob job(2, 1);
  AgentOptions o1 = fast_agent(1, 2, job.secret, job.log);
  o1.role = std::string(800, 'r');  // the Auth frame must stay under kMaxHandshakeBytes
  Agent a1(o1);
  a1.connect(job.coord->endpoint());
  a1.shutdown(1, std::string(kMaxStringBytes, 'm'));
  ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 10));
  const AbortInfo info = *job.abort_of(0);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.message.size(), kMaxStringBytes);
  ASSERT_TRUE(job.coord->aborted().has_value());
  const std::string whole = job.coord->aborted()->message;
  EXPECT_GT(whole.size(), kMaxStringBytes);
  EXPECT_EQ(whole.rfind(info.message, 0), 0u) << "the ranks' message is the start of the coordinator's";
  EXPECT_NE(whole.find("exited with code 1: mmm"), std::string::npos);
}

TEST(ControlWatchdog, RankThatNeverConnectsAbortsAfterTheConnectTimeout) {
  LocalJob job(3, 2, [](CoordinatorOptions& o) { o.connect_timeout_s = 0.5; });
  ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 10));
  EXPECT_EQ(job.abort_of(0)->rank, 2);
  EXPECT_NE(job.abort_of(0)->message.find("rank 2 never connected"), std::string::npos) << job.abort_of(0)->message;
}

}  // namespace
}  // namespace deepen::control
