// The coordinated stop over real sockets and processes: a signal to one process, ranks racing at full
// speed, a stop before any step; every rank must stop at the same step and none may overshoot it.
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "config/input_error.h"
#include "tests/control/loopback_job.h"

namespace deepen::control {
namespace {

using namespace test_support;

void signal_stops_all_processes_at_one_step(int sig, int signalled_rank) {
  LocalJob job(3, 0);
  // Rank 0 runs five times faster than ranks 1 and 2, as a teacher ahead of its students would.
  std::vector<std::unique_ptr<ChildProcess>> children;
  const int period_ms[3] = {2, 10, 10};
  for (int r = 0; r < 3; ++r) {
    children.push_back(std::make_unique<ChildProcess>(
        agent_child_env(r, 3, job.coord->endpoint(), job.secret, period_ms[r], -1, /*signals=*/true),
        "stop" + std::to_string(sig) + "_" + std::to_string(r)));
  }
  ASSERT_TRUE(eventually([&] {
    for (int r = 0; r < 3; ++r) {
      if (job.step(r) < 5 || children[size_t(r)]->out().find("CHILD READY") == std::string::npos) return false;
    }
    return true;
  }, 15));
  int64_t max_seen = 0;
  for (const auto& r : job.coord->ranks()) max_seen = std::max(max_seen, r.step);
  children[size_t(signalled_rank)]->signal(sig);
  std::set<std::string> stops;
  for (int r = 0; r < 3; ++r) {
    const auto code = children[size_t(r)]->wait_exit(15);
    ASSERT_TRUE(code.has_value()) << "rank " << r << " did not stop";
    EXPECT_EQ(*code, kExitRequeue) << "rank " << r << ": " << children[size_t(r)]->err();
    const std::string out = children[size_t(r)]->out();
    const size_t at = out.find("CHILD STOP ");
    ASSERT_NE(at, std::string::npos) << out;
    stops.insert(out.substr(at + 11, out.find('\n', at) - at - 11));
  }
  ASSERT_EQ(stops.size(), 1u) << "ranks stopped at different steps";
  const int64_t s = std::stoll(*stops.begin());
  EXPECT_EQ(job.coord->stop_step(), s);
  EXPECT_GE(s, max_seen) << "the stop step is behind a rank's step at the time of the signal";
  EXPECT_TRUE(job.coord->wait_all_done(5));
  for (const auto& r : job.coord->ranks()) {
    EXPECT_EQ(r.exit_code, kExitRequeue);
    EXPECT_EQ(r.step, s) << "rank " << r.rank << " reported a step other than the stop step";
  }
  EXPECT_FALSE(job.coord->aborted().has_value());
}

TEST(ControlStop, Sigusr1OnOneProcessStopsEveryProcessAtTheSameStepWithTheRequeueCode) {
  signal_stops_all_processes_at_one_step(SIGUSR1, 1);
}

TEST(ControlStop, SigtermOnTheFastestProcessStopsEveryProcessAtTheSameStep) {
  signal_stops_all_processes_at_one_step(SIGTERM, 0);
}

// Ranks stepping as fast as they can at different speeds, coupled as in the real job: a rank cannot
// finish step s while the slowest has completed fewer than s - 3 (a teacher's bounded in-flight
// buffer, a student waiting for logits). A stop requested at a random moment by a random rank:
// every rank must stop at the same step, none may have begun a step beyond it (stop_step would
// throw logic_error), the step is at least where the fastest rank was, and nothing deadlocks.
TEST(ControlStop, RanksRacingAtFullSpeedAllAgreeAndNoneOvershoots) {
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 5; ++round) {
    std::array<std::atomic<int64_t>, 4> completed{};
    std::atomic<bool> round_running{true};
    auto coupled = [&](int rank) {
      return [&, rank](int64_t s) {
        auto slowest = [&] {
          int64_t m = completed[0];
          for (auto& c : completed) m = std::min<int64_t>(m, c);
          return m;
        };
        while (round_running && s - slowest() >= 3) std::this_thread::yield();
        completed[size_t(rank)] = s + 1;
      };
    };
    LocalJob job(4, 4);
    std::vector<std::unique_ptr<Trainer>> trainers;
    const int period_us[4] = {0, 0, 100, 300};
    for (int r = 0; r < 4; ++r) {
      trainers.push_back(std::make_unique<Trainer>(job.agent(r), std::chrono::microseconds(period_us[r]),
                                                   -1, coupled(r)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 100));
    const int64_t fastest_before = trainers[0]->step;
    job.agent(int(rng() % 4)).request_stop("test round " + std::to_string(round));
    for (size_t r = 0; r < trainers.size(); ++r) {
      auto& t = trainers[r];
      ASSERT_TRUE(eventually([&] { return t->finished.load(); }, 20))
          << "round " << round << " rank " << r << " at step " << t->step << " never stopped; log:\n"
          << job.log.all();
      t->join();
    }
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(trainers[size_t(r)]->error.empty()) << "rank " << r << ": " << trainers[size_t(r)]->error;
      EXPECT_EQ(trainers[size_t(r)]->stopped_at, job.coord->stop_step()) << "round " << round << " rank " << r;
    }
    EXPECT_GE(*job.coord->stop_step(), fastest_before);
    round_running = false;
    for (int r = 0; r < 4; ++r) job.agent(r).shutdown(kExitRequeue);
  }
}

TEST(ControlStop, StopBeforeAnyStepStopsEveryRankAtItsFirstStep) {
  LocalJob job(2, 2);
  Agent &a0 = job.agent(0), &a1 = job.agent(1);
  a1.request_stop("early");
  ASSERT_TRUE(eventually([&] { return a0.decided_stop_step() && a1.decided_stop_step(); }, 10));
  EXPECT_EQ(job.coord->stop_step(), kStopAtFirstStep);
  EXPECT_EQ(a0.stop_step(40), 40) << "both resume from checkpoint step 40 and stop there";
  EXPECT_EQ(a1.stop_step(40), 40);
}

// A shared teacher's job: a teacher stage serving run a from step 50 and run b from step 100 (a
// resumed earlier than b), one student each. The example of agent.h's stop_steps.
struct SharedTeacherJob {
  LocalJob job{3, 0};
  std::unique_ptr<Agent> teacher, a, b;
  SharedTeacherJob() {
    teacher = agent(0, "teacher p0 s0", "");
    teacher->set_served_runs({{"a", 50, 200}, {"b", 100, 200}});
    a = agent(1, "student 0", "a");
    b = agent(2, "student 0", "b");
    for (int64_t s = 50; s <= 52; ++s) {
      EXPECT_TRUE(teacher->stop_steps(s).empty());
      EXPECT_EQ(a->stop_step(s), std::nullopt);
    }
    EXPECT_EQ(b->stop_step(100), std::nullopt) << "b's student began step 100: it waits for its targets";
  }
  std::unique_ptr<Agent> agent(int rank, const std::string& role, const std::string& run) {
    AgentOptions o = fast_agent(rank, 3, job.secret, job.log);
    o.role = role;
    o.run = run;
    auto agent = std::make_unique<Agent>(o);
    agent->connect(job.coord->endpoint());
    return agent;
  }
};

TEST(ControlStop, RunsOfASharedTeacherStopAtStepsOfTheirOwn) {
  SharedTeacherJob j;
  j.b->request_stop("SIGUSR1 in the test");
  ASSERT_TRUE(eventually([&] { return j.a->decided_stop_step() && j.b->decided_stop_step(); }, 10)) << j.job.log.all();
  EXPECT_EQ(j.job.coord->stop_steps(), (RunSteps{{"a", 53}, {"b", 101}}))
      << "a stops a step after the teacher's, b after the step its student began, not 101 for a";
  EXPECT_EQ(j.a->stop_step(53), 53);
  EXPECT_EQ(j.b->stop_step(101), 101);
  EXPECT_EQ(j.teacher->stop_steps(53), (RunSteps{{"a", 53}, {"b", 101}}));
  for (Agent* x : {j.a.get(), j.b.get(), j.teacher.get()}) x->shutdown(kExitRequeue);
  EXPECT_FALSE(j.job.coord->aborted().has_value());
}

TEST(ControlStop, ARunLeavingAloneLeavesTheOthersRunning) {
  SharedTeacherJob j;
  EXPECT_EQ(j.a->leave_run("guard: step 52: the loss is nan"), 53);
  EXPECT_EQ(j.job.coord->stop_steps(), (RunSteps{{"a", 53}}));
  EXPECT_EQ(j.b->stop_step(101), std::nullopt) << "b goes on";
  EXPECT_EQ(j.teacher->stop_steps(101), (RunSteps{{"a", 53}}));
  j.a->shutdown(kExitDiverged, "run a diverged");
  ASSERT_TRUE(eventually([&] { return j.job.coord->ranks()[1].state == RankState::kDone; }, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a few watchdog ticks
  EXPECT_FALSE(j.job.coord->aborted().has_value()) << "a diverged run that left by agreement aborts nobody";
  // Later, a signal stops b (and nothing of a changes).
  j.teacher->request_stop("SIGUSR1 in the test");
  ASSERT_TRUE(eventually([&] { return j.b->decided_stop_step().has_value(); }, 10)) << j.job.log.all();
  EXPECT_EQ(j.job.coord->stop_steps(), (RunSteps{{"a", 53}, {"b", 102}}));
  j.b->shutdown(kExitRequeue);
  j.teacher->shutdown(kExitRequeue);
  // The coordinator reads the Byes on its own thread; the host waits for them all the same way.
  ASSERT_TRUE(eventually([&] { return job_exit_code(j.job.coord->ranks()).has_value(); }, 10)) << j.job.log.all();
  EXPECT_EQ(job_exit_code(j.job.coord->ranks()), kExitRequeue) << "b still needs the requeue";
}

}  // namespace
}  // namespace deepen::control
