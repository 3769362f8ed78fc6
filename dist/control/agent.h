// Agent: every rank's link to the coordinator: heartbeats, the coordinated stop, abort on failure.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/control/activity.h"
#include "dist/control/endpoint.h"
#include "dist/control/policy.h"
#include "dist/control/secret.h"

namespace deepen::control {

// Connecting failed, or the job aborted while the caller waited (message says which and why).
class ControlError : public std::runtime_error {
 public:
  explicit ControlError(const std::string& what) : std::runtime_error(what) {}
};

using Metrics = std::map<std::string, double>;

struct AgentOptions {
  int rank = 0;
  int world = 1;
  std::string host;                 // this rank's host name for messages; empty = gethostname()
  std::string role;                 // "teacher p0 s1", "student 3": shown in messages and /metrics
  std::string run;                  // the run a student trains; "" for a teacher or a job of one run
  Secret secret{};
  double heartbeat_s = 5;
  double watchdog_s = 120;          // the coordinator silent this long counts as lost
  double connect_timeout_s = 120;   // keep retrying a refused connect this long (it may start later)
  bool handle_signals = false;      // SIGTERM and SIGUSR1 request a coordinated stop
  // Bytes waiting to be sent once the kernel's buffers are full; past it the coordinator counts as
  // having stopped reading and the job aborts (the policy: dist/control/framed_connection.h).
  size_t max_send_queue_bytes = kDefaultMaxSendQueueBytes;
  // Called once, on the agent's thread, when the job aborts (the watchdog fired, the coordinator
  // was lost). Abort the communicators here (ncclCommAbort, MPI_Abort): the trainer thread may be
  // stuck in a collective that only that can release. Must be thread-safe with the trainer.
  std::function<void(const AbortInfo&)> on_abort;
  // After on_abort, if the process is still alive this many seconds later, it ends with
  // std::_Exit(1): a hung collective cannot be unwound, and a job that must not hang cannot wait
  // for it. < 0 = never (tests, or callers that exit on their own).
  double hard_exit_after_s = -1;
  std::function<void(const std::string&)> log;  // one line per event; default: stderr
  // The trainer thread's activity, sampled at each heartbeat (computing / waiting / blocked: see
  // dist/control/activity.h); null = not reported, and only a new step or phase is progress.
  std::shared_ptr<TrainerActivity> activity;
};

// A run a teacher stage serves, for the stop protocol: its steps [first_step, end_step) in this job.
struct ServedRun {
  std::string name;  // the run's name as its students' AgentOptions::run says it ("" for a job of one run)
  int64_t first_step = 0;
  int64_t end_step = 0;
};

// Threading: the Agent runs its own Asio thread. report(), stop_step(), request_stop(),
// aborted() may be called from any thread.
class Agent {
 public:
  explicit Agent(AgentOptions options);
  // Without shutdown(): closes the connection abruptly, which the coordinator treats as this rank
  // dying (it aborts the others). That is what a rank leaving by an exception should cause.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Connects (retrying while refused, up to connect_timeout_s), authenticates both ways, starts
  // heartbeats. Throws ControlError naming the endpoint and the reason.
  void connect(const Endpoint& coordinator);

  // The trainer's latest state; sent with the next heartbeat. `step` = optimizer steps completed.
  // A change of step or phase is progress for the stall watchdog: report a phase ("load 3/36",
  // "eval", "checkpoint") around anything that may last longer than control.watchdog_s.
  void report(int64_t step, int64_t stage, int64_t depth, const Metrics& metrics = {},
              const std::string& phase = "train");

  // Coordinated stop. Call at the top of every step, before any work on it, with `step` = steps
  // completed so far (so the first call after resuming from checkpoint step k passes k).
  // Returns nullopt (go on) or S, the agreed step: go on while step < S; at step == S, stop: a
  // student checkpoints S, every rank exits with kExitRequeue.
  //
  // Why every rank agrees and none has gone past S, even though teachers run ahead of students:
  // a stop request makes the coordinator send StopQuery to every rank. Each agent, atomically with
  // respect to stop_step(), freezes: it answers with its reach = 1 + the last step it let begin
  // (a rank that was allowed into step c will have completed c+1 before it asks again), and from
  // then on stop_step() blocks until the decision arrives (one round trip, on agent threads only,
  // so no trainer progress is needed and there is no deadlock). The coordinator takes S = the
  // largest reach. So S >= every rank's current step: teachers ahead stop where they are or soon,
  // students behind keep going to S, fed by the teachers (which do produce up to S). Nobody can
  // have started step S (it would have announced reach S+1). Throws ControlError if the job
  // aborted, and std::logic_error if called with step > S (a step boundary was skipped).
  // Example: teacher began step 12 (reach 13), students began 9 (reach 10) -> S = 13: the teacher
  // finishes step 12 and stops; students run steps 10, 11, 12 and checkpoint at 13.
  std::optional<int64_t> stop_step(int64_t step);

  // Every run's stop is its own (policy.h, decide_run_stops): stop_step() answers for this rank's
  // run (AgentOptions::run). A teacher stage serves several runs, whose steps it counts on one
  // global clock: it says which (set_served_runs, before the job can stop) and asks stop_steps(step)
  // at every global step it begins instead; its reach for a run is then -1 before the run's first
  // step, step + 1 while serving it, and its end step once past it. stop_steps returns every run's
  // decided step so far (kStopAtFirstStep: stop serving the run at its first step).
  // Example: a resumed at 50, b at 100; the teacher began global step 52 and b's students claimed
  // step 100 (they wait for its targets) -> a stops at 53 (a's students at 52 catch up), b at 101:
  // the teacher serves a's step 52, then b's step 100 alone, and every run stops within a step.
  RunSteps stop_steps(int64_t step);
  void set_served_runs(std::vector<ServedRun> runs);

  // What a SIGTERM/SIGUSR1 does, for callers with other triggers (a stop file, tests).
  void request_stop(const std::string& reason);

  // This rank's run leaves the job alone (the divergence guard ended it): asks for a stop of this
  // run only and returns its agreed step once decided (>= the step this rank is in + 1; the others
  // runs go on). The run's students then take whatever the teacher sent them before that step.
  int64_t leave_run(const std::string& reason);

  // This rank's run's decided stop step without blocking or claiming a step (kStopAtFirstStep possible).
  std::optional<int64_t> decided_stop_step() const;

  std::optional<AbortInfo> aborted() const;

  // Leaves on purpose: sends Bye(exit_code, message) so the coordinator does not count this rank as
  // lost, then closes. An exit code other than 0 or 3 still aborts the others, with this message and
  // this exit code (AbortInfo::exit_code); this rank then stays until that Abort comes back (at most
  // 2 s), so every other rank has the reason before a launcher ends the job at this exit.
  void shutdown(int exit_code, const std::string& message = {});

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace deepen::control
