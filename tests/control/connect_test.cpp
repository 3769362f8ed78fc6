// Connecting across a network: a coordinator that is busy (control max_pending unauthenticated
// connections waiting) is retried within the connect timeout and named "busy"; a coordinator that
// never answers (the SYN dropped, as on a cut link) is a named error at the connect timeout, not a
// hang; the coordinator's counters are on /metrics (real loopback sockets).
#include <fcntl.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "tests/control/loopback_job.h"
#include "tests/control/raw_peer.h"

namespace deepen::control {
namespace {

using namespace test_support;
using Seconds = std::chrono::duration<double>;

TEST(ControlConnect, RankTurnedAwayAsBusyRetriesAndConnectsOnceTheWaitingConnectionsTimeOut) {
  // 4 unauthenticated connections held by a local client fill max_pending; they time out after 1 s.
  LocalJob job(2, 1, [](CoordinatorOptions& o) {
    o.max_pending = 4;
    o.auth_timeout_s = 1.0;
  });
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(raw_connect(job.coord->endpoint().port));
  ASSERT_TRUE(eventually([&] { return job.coord->stats().accepted >= 5u; }, 5));  // rank 0's + 4
  AgentOptions o = fast_agent(1, 2, job.secret, job.log);
  o.connect_timeout_s = 10;
  Agent late(o);
  const auto t0 = std::chrono::steady_clock::now();
  late.connect(job.coord->endpoint());
  const double took = Seconds(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(job.coord->stats().refused_busy, 1u);
  EXPECT_TRUE(job.log.contains("is busy")) << job.log.all();
  EXPECT_TRUE(job.log.contains("connected to the coordinator after it turned")) << job.log.all();
  EXPECT_LT(took, 5.0);
  for (int fd : held) ::close(fd);
  late.shutdown(0);
  job.agent(0).shutdown(0);
}

TEST(ControlConnect, RankTurnedAwayAsBusyUntilItsConnectTimeoutSaysBusy) {
  LocalJob job(2, 1, [](CoordinatorOptions& o) {
    o.max_pending = 2;
    o.auth_timeout_s = 30;  // held past the rank's connect timeout
  });
  const int a = raw_connect(job.coord->endpoint().port), b = raw_connect(job.coord->endpoint().port);
  ASSERT_TRUE(eventually([&] { return job.coord->stats().accepted >= 3u; }, 5));
  AgentOptions o = fast_agent(1, 2, job.secret, job.log);
  o.connect_timeout_s = 1.0;
  Agent late(o);
  try {
    late.connect(job.coord->endpoint());
    ADD_FAILURE() << "connected past a full max_pending";
  } catch (const ControlError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("busy"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 on host-1"), std::string::npos) << what;
    EXPECT_NE(what.find("max_pending"), std::string::npos) << what;
  }
  ::close(a);
  ::close(b);
  job.agent(0).shutdown(0);
}

TEST(ControlConnect, ACoordinatorThatNeverAnswersIsANamedErrorAtTheConnectTimeout) {
  // A listener whose accept queue is full and never drained: the kernel drops further SYNs, as a cut
  // link or a firewall does, and a plain connect() would retry them for minutes.
  RawListener full;
  ::listen(full.fd, 0);
  std::vector<int> fill;
  for (int i = 0; i < 4; ++i) {
    const int fd = raw_socket(0);
    ::fcntl(fd, F_SETFL, O_NONBLOCK);
    const sockaddr_in addr = loopback(full.port);
    (void)!::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    fill.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  LogSink log;
  AgentOptions o = fast_agent(2, 3, generate_secret(), log);
  o.connect_timeout_s = 1.5;
  Agent agent(o);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    agent.connect(Endpoint{"127.0.0.1", full.port});
    ADD_FAILURE() << "connected to a listener that never accepts";
  } catch (const ControlError& e) {
    const double took = Seconds(std::chrono::steady_clock::now() - t0).count();
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 2 on host-2"), std::string::npos) << what;
    EXPECT_NE(what.find("within control connect timeout 1.5 s"), std::string::npos) << what;
    EXPECT_GE(took, 1.4) << what;
    EXPECT_LT(took, 4.0) << what;
  }
  for (int fd : fill) ::close(fd);
}

TEST(ControlConnect, AnUnresolvableCoordinatorHostIsNamedWithinTheConnectTimeout) {
  LogSink log;
  AgentOptions o = fast_agent(1, 2, generate_secret(), log);
  o.connect_timeout_s = 0.5;
  Agent agent(o);
  try {
    agent.connect(Endpoint{"no-such-node.invalid", 4242});  // .invalid never resolves (RFC 2606)
    ADD_FAILURE() << "connected to an unresolvable host";
  } catch (const ControlError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot resolve no-such-node.invalid"), std::string::npos) << what;
    EXPECT_NE(what.find("DEEPEN_COORDINATOR"), std::string::npos) << what;
  }
}

TEST(ControlConnect, CoordinatorCountersAreOnMetrics) {
  LocalJob job(2, 1, [](CoordinatorOptions& o) {
    o.metrics = true;
    o.max_pending = 1;
  });
  // A wrong secret, garbage, and a connection over max_pending while one waits.
  const int fd = raw_connect(job.coord->endpoint().port);
  ASSERT_TRUE(raw_forged_auth(fd));
  EXPECT_TRUE(closed_by_peer(fd, 5));
  ::close(fd);
  const int junk = raw_connect(job.coord->endpoint().port);
  raw_send(junk, {0xff, 0xff, 0xff, 0xff});
  EXPECT_TRUE(closed_by_peer(junk, 5));
  ::close(junk);
  const int waiting = raw_connect(job.coord->endpoint().port), turned = raw_connect(job.coord->endpoint().port);
  EXPECT_TRUE(closed_by_peer(turned, 5));
  ::close(turned);
  ::close(waiting);
  std::string body;
  ASSERT_TRUE(eventually([&] {
    body = http_get(job.coord->metrics_endpoint()->port, "GET /metrics HTTP/1.0\r\n\r\n");
    return body.find("deepen_control_connections_total{outcome=\"rejected_auth\"} 1") != std::string::npos &&
           body.find("deepen_control_connections_total{outcome=\"refused_busy\"} 1") != std::string::npos &&
           body.find("deepen_control_connections_total{outcome=\"protocol_errors\"} 1") != std::string::npos;
  }, 5)) << body;
  EXPECT_NE(body.find("# TYPE deepen_control_connections_total counter"), std::string::npos) << body;
  EXPECT_NE(body.find("deepen_control_connections_total{outcome=\"authenticated\"} 1"), std::string::npos) << body;
  EXPECT_NE(body.find("deepen_control_http_requests_total"), std::string::npos) << body;
  job.agent(0).shutdown(0);
}

}  // namespace
}  // namespace deepen::control
