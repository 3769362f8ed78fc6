// TrainerActivity: whether a rank's trainer thread is computing or waiting, as its heartbeats tell
// the watchdog, so that a long computation is not taken for a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace deepen::control {

// Why (docs/cluster.md, "When something fails", the hang row): the watchdog's stall rule aborts
// a job in which no rank has made progress for control.watchdog_s. Progress used to mean a new
// step or phase only, so one paper-shape step longer than the limit (minutes on a CPU; a lone
// process has no collective to hang in at all) aborted a healthy job. What hangs is a rank that
// waits: in a collective or a receive whose peer never comes, in I/O, on a lock. A rank whose
// trainer thread computes is alive. So each heartbeat says which of the three it is:
//   computing: outside every communicator wait, and its trainer thread used CPU since the last
//              heartbeat (a thread blocked in I/O, on a lock or asleep uses none), and no NCCL
//              operation it posted is still pending: a GPU rank's host can spin in a CUDA sync
//              behind a hung collective, looking busy; its pending operation tells.
//   waiting:   inside a communicator wait (named: "recv from rank 1 tag 12 (4,978,638,848 bytes)"),
//              or with a posted NCCL operation unfinished.
//   blocked:   neither: outside any wait but using no CPU (I/O, a lock, a sleep).
// A computing rank counts as progress for the stall rule; waiting and blocked ones do not. So a
// hang (every rank waiting or blocked) still aborts within watchdog_s; a frozen process is caught
// by its missing heartbeats and a dead one by its closed connection, as before. What this cannot
// tell from a long step is a rank computing forever (an endless loop): it is alive by every sign.
// The alternative, a timeout per phase, needs a bound on each phase's length that no config states
// (a step's time scales with shapes, devices and load), so a long step would still be a guess.
class TrainerActivity {
 public:
  enum class State { kComputing, kWaiting, kBlocked };
  struct Sample {
    State state = State::kComputing;
    std::string what;  // kWaiting: the operation; kBlocked: ""; kComputing: ""
  };

  // The calling thread is the trainer thread: its CPU clock is the one sampled.
  TrainerActivity();

  // RAII on the trainer thread around a blocking wait on other ranks. Nests (the outermost names it).
  class Wait {
   public:
    Wait(TrainerActivity* activity, std::string what);
    ~Wait();
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;

   private:
    TrainerActivity* activity_;
  };

  // An operation posted to run without the host (NCCL on a GPU stream); `finished` is asked from
  // the agent's thread until it returns true, and must be thread-safe (cudaEventQuery is).
  void pending(std::string what, std::function<bool()> finished);

  // On the agent's thread, once per heartbeat: the state since the previous call. `min_cpu_share`:
  // the share of the wall time between two samples the trainer thread must have used to count as
  // computing (a blocked thread uses none; an oversubscribed computing one a fair share of a core).
  Sample sample(double min_cpu_share = 0.01);

 private:
  double trainer_cpu_seconds() const;
  clockid_t cpu_clock_{};
  bool has_cpu_clock_ = false;
  std::mutex mu_;
  int depth_ = 0;     // nested Waits on the trainer thread
  std::string what_;  // the outermost Wait's operation
  struct Pending {
    std::string what;
    std::function<bool()> finished;
  };
  std::deque<Pending> pending_;
  double last_cpu_s_ = 0;
  std::chrono::steady_clock::time_point last_wall_;
};

}  // namespace deepen::control
