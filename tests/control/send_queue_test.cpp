// The send-queue bound on both ends of the control plane, with the real Agent and Coordinator: a peer
// that completes the handshake and then stops reading is dropped, and the job aborts naming it.
#include <unistd.h>

#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "dist/control/agent.h"
#include "dist/control/coordinator.h"
#include "tests/control/loopback_job.h"
#include "tests/control/raw_peer.h"

namespace deepen::control {
namespace {

using namespace test_support;

constexpr size_t kSmallestBound = kMaxFrameBytes + 4 + kFrameMacBytes;

// The agent's end: a coordinator (by hand, with the job's secret) that authenticates it and then
// reads nothing more. Heartbeats pile up; the agent drops the link at its bound and aborts, well
// before its silence watchdog would.
TEST(ControlSendQueue, AgentWhoseCoordinatorStopsReadingAbortsNamingTheCoordinatorAndTheBound) {
  const Secret secret = generate_secret();
  RawListener coordinator(/*rcvbuf=*/4096);
  int fd = -1;
  bool handshake_ok = false;
  std::thread fake([&] {
    fd = coordinator.accept_one();
    handshake_ok = raw_coordinator_handshake(fd, secret);
  });
  LogSink log;
  AbortCatcher caught;
  AgentOptions o = fast_agent(0, 1, secret, log);
  o.heartbeat_s = 0.001;  // large heartbeats as fast as the timer goes...
  o.watchdog_s = 60;      // ...and a silence watchdog too far off to be what fires
  o.max_send_queue_bytes = kSmallestBound;
  o.on_abort = caught.fn();
  Agent agent(o);
  agent.connect(Endpoint{"127.0.0.1", coordinator.port});
  fake.join();
  ASSERT_TRUE(handshake_ok);
  Metrics big;  // ~35 KB a heartbeat
  for (int i = 0; i < int(kMaxMetrics); ++i) big["metric_" + std::string(100, 'x') + std::to_string(i)] = i;
  agent.report(1, 0, 1, big);
  ASSERT_TRUE(eventually([&] { return caught.get().has_value(); }, 30)) << log.all();
  const std::string message = caught.get()->message;
  EXPECT_NE(message.find("lost the control connection to the coordinator at 127.0.0.1:" +
                         std::to_string(coordinator.port)), std::string::npos) << message;
  EXPECT_NE(message.find("the peer stopped reading"), std::string::npos) << message;
  EXPECT_NE(message.find("send-queue bound of " + std::to_string(kSmallestBound) + " bytes"), std::string::npos)
      << message;
  EXPECT_NE(message.find("frozen or overloaded"), std::string::npos) << message;
  EXPECT_EQ(message.find("silent for"), std::string::npos) << "the silence watchdog fired, not the bound";
  EXPECT_THROW(agent.stop_step(1), ControlError) << "the trainer learns it at its next step";
  EXPECT_TRUE(closed_by_peer(fd, 10)) << "the agent left its end open";
  ::close(fd);
}

// The coordinator's end: rank 1 authenticates by hand and then reads nothing. Pings pile up for it
// (large ones: rank 1 hosts the coordinator here, so its long host name rides in each); the
// coordinator drops it at the bound and the watchdog aborts the job naming rank 1 and why.
TEST(ControlSendQueue, CoordinatorDropsARankThatStopsReadingAndTheJobAbortsNamingIt) {
  LocalJob job(2, 1, [](CoordinatorOptions& o) {
    o.host_rank = 1;
    o.heartbeat_s = 0.001;  // pings as fast as the timer goes
    o.watchdog_s = 60;      // no heartbeat-age or stall verdict can come first
    o.max_send_queue_bytes = kSmallestBound;
  });
  const std::string long_host(800, 'h');  // the Auth frame must stay under kMaxHandshakeBytes
  const int fd = raw_connect(job.coord->endpoint().port, /*rcvbuf=*/4096);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(raw_agent_handshake(fd, job.secret, Auth{1, 2, 4242, long_host, "student 1", "", {}, {}}));
  ASSERT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 60)) << job.log.all();
  const AbortInfo info = *job.abort_of(0);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.host, long_host);
  EXPECT_EQ(info.message.rfind("rank 1 on " + long_host + " (student 1, pid 4242), before its first step: "
                               "control connection dropped by the coordinator: the peer stopped reading: ", 0),
            0u) << info.message;
  EXPECT_NE(info.message.find("send-queue bound of " + std::to_string(kSmallestBound) + " bytes"),
            std::string::npos) << info.message;
  EXPECT_NE(info.message.find("the process is frozen or overloaded"), std::string::npos) << info.message;
  EXPECT_EQ(job.coord->ranks()[1].state, RankState::kLost);
  EXPECT_TRUE(job.log.contains("dropping rank 1: the peer stopped reading"));
  EXPECT_FALSE(job.coord->ranks()[0].state == RankState::kLost) << "the rank that reads was not dropped";
  EXPECT_TRUE(closed_by_peer(fd, 10)) << "the coordinator left its end open";
  ::close(fd);
}

}  // namespace
}  // namespace deepen::control
