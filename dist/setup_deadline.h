// Communicator set-up under a deadline: the polling wait with an injected clock, and the message
// that ends a job whose NCCL set-up hangs (naming the ranks, the stage and the NCCL env that matters).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace deepen {

// What one poll of a set-up step saw: still going, finished, or failed (the poller throws then).
enum class SetupPoll { kPending, kDone };

// Polls `poll` until it says kDone or `timeout_s` has passed on `now`'s clock, calling `pause`
// between polls. Returns true when done, false on timeout. The deadline is checked after each poll,
// so a step that finishes in the same poll as the deadline passes counts as done (a set-up that
// succeeded is never thrown away), and `poll` runs at least once even with timeout_s = 0.
// Example (timeout 10 s, a clock that advances 4 s per pause): polls at t = 0, 4, 8, 12 ->
// pending, pending, pending, pending -> false after the poll at t = 12 (12 > 10);
// with kDone at t = 8 -> true after three polls.
bool wait_with_deadline(const std::function<SetupPoll()>& poll,
                        const std::function<std::chrono::steady_clock::time_point()>& now,
                        const std::function<void()>& pause, double timeout_s);

// Where a set-up stopped: not all ranks of the group arrived (an MPI barrier on the bootstrap
// communicator did not complete), or all arrived but NCCL did not connect them.
enum class SetupStage { kRanksArriving, kNcclConnecting };

struct SetupTimeout {
  SetupStage stage = SetupStage::kNcclConnecting;
  std::vector<int> group_world_ranks;  // world ranks of the communicator being made, in its order
  int world_rank = 0;                  // this process
  std::string host;
  int device = -1;                     // this rank's CUDA device
  double timeout_s = 0;                // control.nccl_setup_timeout_s
};

// The NCCL variables that decide which network NCCL uses, as "NAME=value" or "NAME unset", in this
// order: NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_IB_HCA, NCCL_IB_DISABLE, NCCL_NET,
// NCCL_DEBUG. `getenv` is injected (tests); it returns nullptr for an unset variable.
std::string nccl_network_env(const std::function<const char*(const char*)>& getenv);

// The error that ends the job. Examples (timeout 300 s, group of world ranks 4..6, this rank 5):
//   kRanksArriving: "NCCL set-up of the group of world ranks 4, 5, 6 timed out on world rank 5
//     (node03, cuda:1): not every rank reached it within control.nccl_setup_timeout_s = 300 s; a rank
//     is stuck before it or died (look for the first error in the other ranks' output)"
//   kNcclConnecting: "... timed out on world rank 5 (node03, cuda:1): all 3 ranks reached
//     ncclCommInitRank but NCCL did not connect them within control.nccl_setup_timeout_s = 300 s;
//     usually NCCL picked a network interface the nodes cannot reach each other on: set
//     NCCL_SOCKET_IFNAME (and NCCL_IB_HCA) for this cluster, and rerun with NCCL_DEBUG=INFO to see
//     NCCL's choice. NCCL env: NCCL_SOCKET_IFNAME unset, ..."
std::string setup_timeout_message(const SetupTimeout& t, const std::string& nccl_env);

}  // namespace deepen
