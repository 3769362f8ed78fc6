// FramedConnection on a real loopback TCP pair: the send-queue bound (a peer that stops reading is
// closed, one that reads never is), flush-then-close, the frame-size bounds, and how each close is
// reported.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <gtest/gtest.h>

#include "dist/control/agent.h"
#include "dist/control/coordinator.h"
#include "dist/control/framed_connection.h"
#include "tests/control/raw_peer.h"

namespace deepen::control {
namespace {

using namespace test_support;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr size_t kSmallestBound = kMaxFrameBytes + 4 + kFrameMacBytes;  // one largest frame

// A FramedConnection on one end of a loopback TCP pair, driven on the test's thread (pump() runs its
// io_context); the far end is a plain socket the test reads, writes or ignores.
struct Pair {
  asio::io_context io;
  int far = -1;
  std::shared_ptr<FramedConnection> conn;
  std::vector<Message> received;
  std::optional<CloseCause> cause;
  std::string why;
  int close_reports = 0;

  // `far_rcvbuf` > 0 gives the far end a small receive window, so that unread bytes back up fast.
  explicit Pair(size_t bound = kSmallestBound, int far_rcvbuf = 0) {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    far = raw_connect(acceptor.local_endpoint().port(), far_rcvbuf);
    tcp::socket near(io);
    acceptor.accept(near);
    conn = std::make_shared<FramedConnection>(std::move(near), bound);
    conn->start([this](Message m) { received.push_back(std::move(m)); },
                [this](CloseCause c, const std::string& w) {
                  cause = c;
                  why = w;
                  ++close_reports;
                });
  }
  ~Pair() {
    conn->close();
    if (far >= 0) ::close(far);
  }

  // Runs the io_context until `done` holds or timeout_s passes; returns whether it held.
  bool pump_until(const std::function<bool()>& done, double timeout_s = 10) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_for(std::chrono::milliseconds(1));
      io.restart();
    }
    return done();
  }
  void pump_for(double seconds) {
    pump_until([] { return false; }, seconds);
  }
};

// The largest heartbeat the agent sends: 256 metrics with 128-byte names and a 4 KiB phase.
Heartbeat largest_heartbeat(int64_t step) {
  Heartbeat hb;
  hb.step = step;
  hb.phase = std::string(kMaxStringBytes, 'p');
  for (size_t i = 0; i < kMaxMetrics; ++i) {
    std::string name = "m" + std::to_string(i);
    name.resize(kMaxMetricName, '_');
    hb.metrics.emplace_back(name, double(i));
  }
  return hb;
}

// Refused where the options are taken (the Agent's and the Coordinator's constructors), not later
// on an io thread.
TEST(FramedConnection, RefusesASendQueueBoundThatCannotHoldOneLargestFrame) {
  asio::io_context io;
  EXPECT_THROW(FramedConnection(tcp::socket(io), kSmallestBound - 1), std::invalid_argument);
  EXPECT_NO_THROW(FramedConnection(tcp::socket(io), kSmallestBound));
  EXPECT_GE(kDefaultMaxSendQueueBytes, kSmallestBound);
  AgentOptions agent;
  agent.max_send_queue_bytes = kSmallestBound - 1;
  EXPECT_THROW(Agent{agent}, std::invalid_argument);
  CoordinatorOptions coordinator;
  coordinator.max_send_queue_bytes = kSmallestBound - 1;
  EXPECT_THROW(Coordinator{coordinator}, std::invalid_argument);
}

// The policy's first half: a peer that reads nothing is closed once the unsent bytes would pass the
// bound, and the queue never holds more than the bound on the way there.
TEST(FramedConnection, PeerThatStopsReadingIsClosedAtTheBoundAndTheQueueNeverHoldsMore) {
  Pair p(kSmallestBound, /*far_rcvbuf=*/4096);
  const StopRequest big{std::string(kMaxStringBytes, 'x')};
  size_t most = 0;
  int sent = 0;
  // The kernel buffers a few MiB at most before the bound comes into play; 400 MiB would be a bug.
  while (p.conn->is_open() && sent < 100000) {
    p.conn->send(big);
    ++sent;
    p.io.poll();  // let the writes reach the kernel, as the io thread would between sends
    p.io.restart();
    most = std::max(most, p.conn->queued_bytes());
  }
  ASSERT_TRUE(p.cause.has_value()) << sent << " frames sent to a peer that reads nothing, and still open";
  EXPECT_EQ(*p.cause, CloseCause::kSendQueueFull);
  EXPECT_NE(p.why.find("the peer stopped reading"), std::string::npos) << p.why;
  EXPECT_NE(p.why.find("send-queue bound of " + std::to_string(kSmallestBound) + " bytes"), std::string::npos)
      << p.why;
  EXPECT_LE(most, kSmallestBound);
  EXPECT_EQ(p.close_reports, 1);
  // Closed means closed: later sends are ignored and nothing more is reported.
  p.conn->send(big);
  p.pump_for(0.05);
  EXPECT_EQ(p.close_reports, 1);
  EXPECT_TRUE(closed_by_peer(p.far, 10)) << "the far end still sees the connection open";
}

// The policy's second half: a peer that reads, here slower than we send, is never closed, however
// close to the bound the queue gets; every frame arrives, in order, largest frames included.
TEST(FramedConnection, PeerThatReadsSlowlyGetsEveryLargestFrameInOrderAndIsNeverClosed) {
  Pair p;
  constexpr int kFrames = 100;
  const size_t frame_bytes = encode_frame(largest_heartbeat(0)).size();
  std::vector<int64_t> steps;
  std::thread reader([&] {
    for (int i = 0; i < kFrames; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const auto m = raw_read_message(p.far, 10);
      if (!m || !std::holds_alternative<Heartbeat>(*m)) return;
      steps.push_back(std::get<Heartbeat>(*m).step);
    }
  });
  size_t most = 0;
  for (int i = 0; i < kFrames && p.conn->is_open(); ++i) {
    // A sender that never outruns the bound: it waits for room, as the agent's heartbeat timer does.
    p.pump_until([&] { return p.conn->queued_bytes() + frame_bytes <= kSmallestBound || !p.conn->is_open(); });
    p.conn->send(largest_heartbeat(i));
    most = std::max(most, p.conn->queued_bytes());
  }
  p.pump_until([&] { return p.conn->queued_bytes() == 0 || !p.conn->is_open(); });
  reader.join();
  EXPECT_TRUE(p.conn->is_open()) << p.why;
  EXPECT_EQ(p.close_reports, 0);
  ASSERT_EQ(steps.size(), size_t(kFrames));
  for (int i = 0; i < kFrames; ++i) EXPECT_EQ(steps[size_t(i)], i);
  EXPECT_GT(frame_bytes, kMaxFrameBytes / 2) << "the test means to send the largest frames";
}

TEST(FramedConnection, CloseAfterFlushWritesEverythingQueuedThenReportsFlushedOnce) {
  Pair p;
  for (int i = 0; i < 20; ++i) p.conn->send(StopRequest{"request " + std::to_string(i)});
  p.conn->close_after_flush();
  ASSERT_TRUE(p.pump_until([&] { return p.cause.has_value(); }));
  EXPECT_EQ(*p.cause, CloseCause::kFlushed);
  EXPECT_EQ(p.close_reports, 1);
  for (int i = 0; i < 20; ++i) {
    const auto m = raw_read_message(p.far, 5);
    ASSERT_TRUE(m && std::holds_alternative<StopRequest>(*m)) << "frame " << i;
    EXPECT_EQ(std::get<StopRequest>(*m).reason, "request " + std::to_string(i));
  }
  EXPECT_TRUE(closed_by_peer(p.far, 5));
}

// Before authentication a peer cannot make us read more than kMaxHandshakeBytes; after it, frames up
// to kMaxFrameBytes pass and a larger announced length still closes the connection.
TEST(FramedConnection, FramesOverTheHandshakeBoundCloseTheConnectionUntilFullFramesAreAllowed) {
  const std::vector<uint8_t> mid = encode_frame(Heartbeat{3, 0, 1, std::string(2000, 'p'), {}});
  {
    Pair p;
    raw_send(p.far, mid);
    ASSERT_TRUE(p.pump_until([&] { return p.cause.has_value(); }));
    EXPECT_EQ(*p.cause, CloseCause::kProtocolError);
    EXPECT_NE(p.why.find("over the bound of " + std::to_string(kMaxHandshakeBytes)), std::string::npos) << p.why;
    EXPECT_TRUE(p.received.empty());
  }
  {
    Pair p;
    p.conn->allow_full_frames();
    raw_send(p.far, mid);
    ASSERT_TRUE(p.pump_until([&] { return !p.received.empty(); })) << p.why;
    EXPECT_EQ(std::get<Heartbeat>(p.received[0]).phase.size(), 2000u);
    raw_send(p.far, {0x00, 0x01, 0x00, 0x01});  // 65537 bytes announced
    ASSERT_TRUE(p.pump_until([&] { return p.cause.has_value(); }));
    EXPECT_EQ(*p.cause, CloseCause::kProtocolError);
    EXPECT_NE(p.why.find("over the bound of " + std::to_string(kMaxFrameBytes)), std::string::npos) << p.why;
  }
}

TEST(FramedConnection, EachWayOfClosingIsReportedOnceWithItsCauseAndTheOwnersCloseNotAtAll) {
  {  // a body that does not decode
    Pair p;
    raw_send(p.far, {0, 0, 0, 3, 0xee, 0x01, 0x02});
    ASSERT_TRUE(p.pump_until([&] { return p.cause.has_value(); }));
    EXPECT_EQ(*p.cause, CloseCause::kProtocolError);
    EXPECT_NE(p.why.find("unknown message type"), std::string::npos) << p.why;
  }
  {  // the peer closes after a whole frame: that frame is delivered, then the end of stream
    Pair p;
    raw_send(p.far, encode_frame(StopAck{{{"", 7}}}));
    ::shutdown(p.far, SHUT_WR);
    ASSERT_TRUE(p.pump_until([&] { return p.cause.has_value(); }));
    EXPECT_EQ(*p.cause, CloseCause::kPeerClosed);
    ASSERT_EQ(p.received.size(), 1u);
    EXPECT_EQ(std::get<StopAck>(p.received[0]).reaches, (RunSteps{{"", 7}}));
  }
  {  // the owner closes: the peer sees it, the owner is not told what it already knows
    Pair p;
    p.conn->close();
    EXPECT_FALSE(p.conn->is_open());
    EXPECT_TRUE(closed_by_peer(p.far, 5));
    p.pump_for(0.05);
    EXPECT_EQ(p.close_reports, 0);
  }
}

}  // namespace
}  // namespace deepen::control
