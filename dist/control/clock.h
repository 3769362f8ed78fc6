// Control-plane time: the steady clock its timers use, and config seconds converted to its durations.
#pragma once

#include <algorithm>
#include <chrono>

namespace deepen::control {

using Clock = std::chrono::steady_clock;

// Negative seconds count as 0 (a timer that fires at once), as a config of 0 means "no wait".
inline Clock::duration from_seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(s, 0.0)));
}

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace deepen::control
