// TrainerActivity and the watchdog: a rank whose trainer thread computes is progressing however long
// its step; one spinning in a communicator wait, or asleep outside any, is not (dist/control/activity.h).
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "dist/control/activity.h"
#include "tests/control/loopback_job.h"

namespace deepen::control {
namespace {

using namespace test_support;
using Clock = std::chrono::steady_clock;

// Burns the calling thread's CPU for `s` seconds.
void compute_for(double s) {
  const auto end = Clock::now() + std::chrono::duration<double>(s);
  volatile double x = 1;
  while (Clock::now() < end)
    for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
}

// A trainer thread: it makes the TrainerActivity (whose CPU clock is its own), then runs `body`.
struct TrainerThread {
  std::shared_ptr<TrainerActivity> activity;
  std::thread thread;
  explicit TrainerThread(std::function<void(TrainerActivity&)> body) {
    std::promise<std::shared_ptr<TrainerActivity>> made;
    auto ready = made.get_future();
    thread = std::thread([&made, body = std::move(body)] {
      auto a = std::make_shared<TrainerActivity>();
      made.set_value(a);
      body(*a);
    });
    activity = ready.get();
  }
  ~TrainerThread() { thread.join(); }
};

TEST(TrainerActivity, TellsComputingFromWaitingFromBlocked) {
  std::atomic<int> phase{0};
  std::atomic<bool> go_on{false};
  auto next = [&](int p) {  // asleep until told to go on: a few wake-ups, well under 1% of a core
    phase = p;
    while (!go_on.exchange(false)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  TrainerThread t([&](TrainerActivity& a) {
    while (!go_on.exchange(false)) compute_for(0.01);  // 1: computing
    {
      const TrainerActivity::Wait w(&a, "recv from rank 1 tag 12 (8 bytes)");
      const TrainerActivity::Wait inner(&a, "inner");  // nested: the outermost names it
      phase = 2;
      while (!go_on.exchange(false)) compute_for(0.01);  // spinning, as MPI's wait does
    }
    next(3);  // asleep outside any wait
    a.pending("all_reduce (4 bytes) on the GPU", [] { return false; });
    next(4);  // a posted operation still unfinished
  });
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  (void)t.activity->sample();
  settle();
  EXPECT_EQ(t.activity->sample().state, TrainerActivity::State::kComputing);
  go_on = true;
  while (phase != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (void)t.activity->sample();
  settle();
  const TrainerActivity::Sample waiting = t.activity->sample();
  EXPECT_EQ(waiting.state, TrainerActivity::State::kWaiting);
  EXPECT_EQ(waiting.what, "recv from rank 1 tag 12 (8 bytes)");
  go_on = true;
  while (phase != 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (void)t.activity->sample();
  settle();
  EXPECT_EQ(t.activity->sample().state, TrainerActivity::State::kBlocked);
  go_on = true;
  while (phase != 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const TrainerActivity::Sample pending = t.activity->sample();
  EXPECT_EQ(pending.state, TrainerActivity::State::kWaiting);
  EXPECT_NE(pending.what.find("all_reduce (4 bytes) on the GPU"), std::string::npos) << pending.what;
  go_on = true;
}

// A one-rank job with a 1 s watchdog, whose agent reports the given trainer activity.
struct LoneRankJob {
  LogSink log;
  Secret secret = generate_secret();
  Coordinator coord{coordinator_options(secret, log)};
  std::unique_ptr<Agents> agents;

  static CoordinatorOptions coordinator_options(const Secret& secret, LogSink& log) {
    CoordinatorOptions o = fast_coordinator(1, secret, log);
    o.watchdog_s = 1.0;
    return o;
  }
  // Connects the agent and reports step 0: from then on only its activity tells progress.
  void connect(std::shared_ptr<TrainerActivity> activity) {
    agents = std::make_unique<Agents>(1, 1, secret, log, coord.endpoint(), [&](AgentOptions& o) {
      o.watchdog_s = 1.0;
      o.activity = activity;
    });
    (*agents)[0].report(0, 0, 1, {});
  }
  std::optional<AbortInfo> abort() { return agents->abort_of(0); }
};

// One rank, watchdog 1 s: a first step computing for 3 s is not a hang (the lone paper-shape
// process used to be aborted "before its first step"); the same rank then spinning in a
// communicator wait is, and the message names the wait.
TEST(ControlWatchdog, LoneRankComputingALongStepIsNotAbortedButAWaitIs) {
  LoneRankJob job;
  std::atomic<int> phase{0};
  std::atomic<bool> release{false};
  TrainerThread t([&](TrainerActivity& a) {
    while (phase == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    compute_for(3.0);
    phase = 2;
    const TrainerActivity::Wait w(&a, "recv from rank 1 tag 12 (4,978,638,848 bytes)");
    while (!release) compute_for(0.01);
  });
  job.connect(t.activity);
  phase = 1;
  while (phase != 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(job.abort().has_value()) << job.abort()->message;
  const bool aborted = eventually([&] { return job.abort().has_value(); }, 15);
  release = true;
  ASSERT_TRUE(aborted);
  const AbortInfo info = *job.abort();
  EXPECT_NE(info.message.find("no rank has made progress"), std::string::npos) << info.message;
  EXPECT_NE(info.message.find("waiting in recv from rank 1 tag 12"), std::string::npos) << info.message;
}

// A rank asleep outside any communicator call (I/O, a lock) is stalled too, and said to be blocked.
TEST(ControlWatchdog, RankBlockedOutsideAnyWaitIsAbortedAsBlocked) {
  LoneRankJob job;
  std::atomic<bool> release{false};
  TrainerThread t([&](TrainerActivity&) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  job.connect(t.activity);
  const bool aborted = eventually([&] { return job.abort().has_value(); }, 15);
  release = true;
  ASSERT_TRUE(aborted);
  EXPECT_NE(job.abort()->message.find("blocked outside any communicator call"), std::string::npos)
      << job.abort()->message;
}

// A teacher that sent its last micro-batch waits in the final barrier while its student evaluates
// and exports for longer than the watchdog; the student then leaves with exit code 0. Its leaving is
// progress: the teacher, stalled for more than watchdog_s, gets watchdog_s to follow it instead of
// being aborted at once (the paper-shape rehearsal's hidden-channel job ended so, after a good run).
TEST(ControlWatchdog, ARankLeavingWithSuccessGivesTheRanksWaitingOnItAFreshWatchdog) {
  LocalJob job(2, 2, [](CoordinatorOptions& o) { o.watchdog_s = 1.0; });
  job.agent(0).report(1, 0, 1, {});  // the teacher: done computing, waiting from now on
  {
    Trainer student(job.agent(1), std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the teacher stalls 2.5 s > 1 s
  }
  EXPECT_FALSE(job.abort_of(0).has_value()) << job.abort_of(0)->message;  // the student's steps kept the job alive
  job.agent(1).shutdown(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the barrier completes well within 1 s
  EXPECT_FALSE(job.abort_of(0).has_value()) << job.abort_of(0)->message;
  // Still stalled a full watchdog_s after the student left: a hang again.
  EXPECT_TRUE(eventually([&] { return job.abort_of(0).has_value(); }, 10));
}

}  // namespace
}  // namespace deepen::control
