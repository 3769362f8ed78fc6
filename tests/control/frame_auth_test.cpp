// Every frame after the handshake carries a MAC: frames injected into, replayed on, or altered in an
// authenticated stream are refused on both ends, and nobody without the keys can stop or abort a job
// in a way of their choosing (real loopback sockets; the frame by hand, the other end real).
#include <thread>

#include <gtest/gtest.h>

#include "tests/control/loopback_job.h"
#include "tests/control/raw_peer.h"

namespace deepen::control {
namespace {

using namespace test_support;

// A coordinator for 2 ranks; rank 0 a real agent, rank 1 this socket, authenticated by hand.
struct HandDrivenRank {
  LocalJob job{2, 1};
  int fd = -1;
  FrameKeys keys;
  HandDrivenRank() {
    fd = raw_connect(job.coord->endpoint().port);
    EXPECT_GE(fd, 0);
    EXPECT_TRUE(raw_agent_handshake(fd, job.secret, Auth{1, 2, 4242, "hand", "student 1", "", {}, {}}, &keys));
  }
  ~HandDrivenRank() {
    if (fd >= 0) ::close(fd);
    job.agent(0).shutdown(0);
  }
  int64_t coordinator_step() const { return step_of(*job.coord, 1); }
};

Heartbeat beat(int64_t step) {
  Heartbeat hb;
  hb.step = step;
  hb.phase = "train";
  return hb;
}

TEST(ControlFrameAuth, AFrameWithItsMacIsReadAndTheSameFrameReplayedClosesTheStreamNamingTheRank) {
  HandDrivenRank r;
  const std::vector<uint8_t> frame = mac_frame(r.keys.agent_to_coordinator, 0, beat(7));
  raw_send(r.fd, frame);
  ASSERT_TRUE(eventually([&] { return r.coordinator_step() == 7; }, 5)) << "a frame with a valid MAC was not read";
  raw_send(r.fd, frame);  // the same bytes again: its sequence number is 1 now
  EXPECT_TRUE(closed_by_peer(r.fd, 5));
  EXPECT_EQ(r.coordinator_step(), 7) << "a replayed frame changed the coordinator's view";
  EXPECT_GE(r.job.coord->stats().protocol_errors, 1u);
  ASSERT_TRUE(eventually([&] { return r.job.coord->aborted().has_value(); }, 5));
  const std::string why = r.job.coord->aborted()->message;
  EXPECT_NE(why.find("rank 1 on hand"), std::string::npos) << why;
  EXPECT_NE(why.find("wrong MAC"), std::string::npos) << why;
}

TEST(ControlFrameAuth, FramesWithoutAMacOrUnderAnotherKeyOrAlteredNeverStopTheJob) {
  const Mac stranger = generate_secret();
  for (int variant = 0; variant < 3; ++variant) {
    HandDrivenRank r;
    std::vector<uint8_t> frame;
    if (variant == 0) frame = encode_frame(StopRequest{"forged"});  // as before frame MACs
    if (variant == 1) frame = mac_frame(stranger, 0, StopRequest{"forged"});
    if (variant == 2) {  // a valid frame with one body byte changed on the way
      frame = mac_frame(r.keys.agent_to_coordinator, 0, StopRequest{"forged"});
      frame[6] ^= 0x20;
    }
    raw_send(r.fd, frame);
    EXPECT_TRUE(closed_by_peer(r.fd, 5)) << "variant " << variant;
    EXPECT_FALSE(r.job.coord->stop_step().has_value()) << "variant " << variant << ": a forged stop was obeyed";
    EXPECT_FALSE(r.job.log.contains("forged")) << "variant " << variant << ":\n" << r.job.log.all();
    EXPECT_GE(r.job.coord->stats().protocol_errors, 1u);
  }
}

TEST(ControlFrameAuth, AnAgentRefusesAnAbortThatLacksTheCoordinatorsMacAndSaysWhy) {
  const Secret secret = generate_secret();
  RawListener listener;
  LogSink log;
  AbortCatcher caught;
  AgentOptions o = fast_agent(0, 1, secret, log);
  o.on_abort = caught.fn();
  Agent agent(o);
  int fd = -1;
  std::thread peer([&] {
    fd = listener.accept_one();
    if (!raw_coordinator_handshake(fd, secret)) return;
    // What an attacker on the path could write after the handshake: an Abort with its own message
    // and exit code, without the coordinator's key.
    raw_send(fd, encode_frame(Abort{3, "evil", 5, "forged abort", 4}));
  });
  agent.connect(Endpoint{"127.0.0.1", listener.port});
  peer.join();
  ASSERT_TRUE(eventually([&] { return caught.get().has_value(); }, 5));
  const AbortInfo info = *caught.get();
  EXPECT_EQ(info.message.find("forged abort"), std::string::npos) << info.message;
  EXPECT_EQ(info.exit_code, 1) << "the forged exit code reached the agent";
  EXPECT_NE(info.message.find("protocol error"), std::string::npos) << info.message;
  EXPECT_NE(info.message.find("MAC"), std::string::npos) << info.message;
  if (fd >= 0) ::close(fd);
}

}  // namespace
}  // namespace deepen::control
