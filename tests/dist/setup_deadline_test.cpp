// NCCL set-up under a deadline without a GPU: the wait loop on an injected clock, and what the
// timeout message tells the user (group, rank, stage, NCCL network env).
#include <chrono>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "config/config.h"
#include "config/input_error.h"
#include "dist/setup_deadline.h"

namespace deepen {
namespace {

using Clock = std::chrono::steady_clock;

// A fake clock that advances `step_s` each time the wait pauses, so no test sleeps.
struct FakeClock {
  Clock::time_point t{};
  double step_s = 4;
  int pauses = 0;
  std::function<Clock::time_point()> now() {
    return [this] { return t; };
  }
  std::function<void()> pause() {
    return [this] {
      ++pauses;
      t += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(step_s));
    };
  }
};

TEST(SetupDeadline, ASetupThatNeverFinishesTimesOutAfterTheLimit) {
  FakeClock clock;  // polls at t = 0, 4, 8, 12: 12 > 10 ends it
  int polls = 0;
  const bool done = wait_with_deadline([&] { ++polls; return SetupPoll::kPending; }, clock.now(), clock.pause(), 10);
  EXPECT_FALSE(done);
  EXPECT_EQ(polls, 4);
  EXPECT_EQ(clock.pauses, 3);
}

TEST(SetupDeadline, ASetupThatFinishesBeforeTheLimitSucceeds) {
  FakeClock clock;
  int polls = 0;
  auto poll = [&] { return ++polls == 3 ? SetupPoll::kDone : SetupPoll::kPending; };  // done at t = 8
  EXPECT_TRUE(wait_with_deadline(poll, clock.now(), clock.pause(), 10));
  EXPECT_EQ(polls, 3);
}

TEST(SetupDeadline, ASetupDoneInThePollThatPassesTheDeadlineIsKept) {
  FakeClock clock;
  clock.step_s = 20;  // the second poll comes at t = 20, past the 10 s limit, and reports done
  int polls = 0;
  EXPECT_TRUE(wait_with_deadline([&] { return ++polls == 2 ? SetupPoll::kDone : SetupPoll::kPending; }, clock.now(),
                                 clock.pause(), 10));
}

TEST(SetupDeadline, AFailingPollEndsTheWaitWithItsError) {
  FakeClock clock;
  EXPECT_THROW(wait_with_deadline([]() -> SetupPoll { throw std::runtime_error("NCCL: remote process exited"); },
                                  clock.now(), clock.pause(), 10),
               std::runtime_error);
}

TEST(SetupDeadline, NcclNetworkEnvListsSetAndUnsetVariables) {
  const std::map<std::string, std::string> vars = {{"NCCL_SOCKET_IFNAME", "ib0"}, {"NCCL_DEBUG", "WARN"}};
  const std::string env = nccl_network_env([&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
  EXPECT_EQ(env,
            "NCCL_SOCKET_IFNAME=ib0, NCCL_SOCKET_FAMILY unset, NCCL_IB_HCA unset, NCCL_IB_DISABLE unset, "
            "NCCL_NET unset, NCCL_DEBUG=WARN");
}

TEST(SetupDeadline, TimeoutMessageNamesGroupRankKeyAndTheInterfaceToCheck) {
  SetupTimeout t;
  t.stage = SetupStage::kNcclConnecting;
  t.group_world_ranks = {4, 5, 6};
  t.world_rank = 5;
  t.host = "node03";
  t.device = 1;
  t.timeout_s = 300;
  const std::string m = setup_timeout_message(t, "NCCL_SOCKET_IFNAME=eth9");
  EXPECT_NE(m.find("group of world ranks 4, 5, 6 timed out on world rank 5 (node03, cuda:1)"), std::string::npos) << m;
  EXPECT_NE(m.find("all 3 ranks reached ncclCommInitRank"), std::string::npos) << m;
  EXPECT_NE(m.find("control.nccl_setup_timeout_s = 300 s"), std::string::npos) << m;
  EXPECT_NE(m.find("set NCCL_SOCKET_IFNAME"), std::string::npos) << m;
  EXPECT_NE(m.find("NCCL env: NCCL_SOCKET_IFNAME=eth9"), std::string::npos) << m;
}

TEST(SetupDeadline, TimeoutBeforeEveryRankArrivedBlamesAStuckRankNotTheNetwork) {
  SetupTimeout t;
  t.stage = SetupStage::kRanksArriving;
  t.group_world_ranks = {0, 1};
  t.host = "n";
  t.timeout_s = 0.5;
  const std::string m = setup_timeout_message(t, "NCCL_SOCKET_IFNAME unset");
  EXPECT_NE(m.find("not every rank reached it within control.nccl_setup_timeout_s = 0.5 s"), std::string::npos) << m;
  EXPECT_EQ(m.find("NCCL_SOCKET_IFNAME"), std::string::npos) << m;
}

TEST(SetupDeadline, ConfigKeyDefaultsTo300AndMustBePositive) {
  EXPECT_EQ(parse_config("", "c.toml").control.nccl_setup_timeout_s, 300);
  EXPECT_EQ(parse_config("[control]\nnccl_setup_timeout_s = 60\n", "c.toml").control.nccl_setup_timeout_s, 60);
  try {
    parse_config("[control]\nnccl_setup_timeout_s = 0\n", "c.toml");
    FAIL() << "0 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("c.toml: control.nccl_setup_timeout_s: must be > 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deepen
