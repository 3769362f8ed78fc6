// How a polling wait paces its polls: spin, then yield, then sleep longer the longer it has waited.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace deepen {

// The sleep between polls after a wait of `waited`: 1/64 of it, at least 50 µs, at most 1 ms. A
// finished request is seen at most ~1.6% (or 50 µs) after it finished, and a rank idle for seconds
// polls 1,000 times a second. Examples: waited 2 ms -> 50 µs; 10 ms -> 156 µs; 64 ms on -> 1 ms.
// Polling MPI also drives its progress, so a longer sleep could slow a transfer that needs both
// sides to poll (TCP between nodes, shared memory without single-copy); 1 ms keeps that cost small,
// and on one node Open MPI copies a large message in one call (CMA).
inline std::chrono::microseconds backoff_sleep(std::chrono::steady_clock::duration waited) {
  using std::chrono::microseconds;
  const auto us = std::chrono::duration_cast<microseconds>(waited).count() / 64;
  return microseconds(std::clamp<long long>(us, 50, 1000));
}

// One wait's pacing: pause() between polls. Spins for the first 50 µs (a streamed micro-batch that
// is about to arrive), yields until 2 ms, then sleeps backoff_sleep(waited): a waiting rank leaves
// the cores to the ranks that compute (bench/waiting_rank_bench.cpp measures what polling costs
// them).
class WaitBackoff {
 public:
  void pause() {
    const auto waited = std::chrono::steady_clock::now() - start_;
    if (waited < std::chrono::microseconds(50)) return;
    if (waited < std::chrono::milliseconds(2)) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(backoff_sleep(waited));
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace deepen
