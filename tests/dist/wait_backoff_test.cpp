// The polling wait's sleep: short while a peer may answer soon, bounded when a rank idles.
#include <gtest/gtest.h>

#include "dist/wait_backoff.h"

namespace deepen {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(WaitBackoff, SleepsOneSixtyFourthOfTheWaitBetweenFiftyMicrosecondsAndOneMillisecond) {
  EXPECT_EQ(backoff_sleep(milliseconds(2)), microseconds(50));     // 31 µs, raised to the floor
  EXPECT_EQ(backoff_sleep(microseconds(3200)), microseconds(50));  // exactly 1/64
  EXPECT_EQ(backoff_sleep(milliseconds(10)), microseconds(156));
  EXPECT_EQ(backoff_sleep(milliseconds(64)), microseconds(1000));
  EXPECT_EQ(backoff_sleep(seconds(600)), microseconds(1000));  // a teacher idle through a long step
}

TEST(WaitBackoff, AFinishedRequestIsSeenAtMostAFewPercentLateOnceTheSleepGrows) {
  // The sleep that follows a wait of w can delay seeing a completion by at most that sleep.
  for (const auto w : {milliseconds(4), milliseconds(20), milliseconds(63)}) {
    const double late = static_cast<double>(backoff_sleep(w).count()) / std::chrono::duration_cast<microseconds>(w).count();
    EXPECT_LE(late, 1.0 / 64 + 1e-12) << w.count() << " ms";
  }
}

}  // namespace
}  // namespace deepen
