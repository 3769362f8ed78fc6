// JobControl: a run's control plane (heartbeats, watchdog, coordinated stop, /metrics) set up from
// [control] and the launch environment, for single-process and distributed jobs alike.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace deepen {

namespace control {
class ControlPlane;
}
class Communicator;

// Rank 0 hosts the coordinator (and /metrics when control.metrics_port > 0). The per-job secret
// comes from DEEPEN_JOB_SECRET(_FILE) or is generated on rank 0 and written with mode 0600 to
// <job_dir>/control.secret (the run's folder; a shared teacher's job: the group's); the secret and the
// coordinator's endpoint reach the other ranks through `world` (nullptr for a single process).
// `role` and `run` name this rank in messages and /metrics ("student 0", "pre-grow"). `on_abort`
// runs when the watchdog stops the job (abort the communicators there); the process exits after
// control.watchdog_s/2 at the latest.
class JobControl {
 public:
  JobControl(const ControlConfig& control, const std::string& job_dir, int rank, int world_size,
             const std::vector<std::string>& hostnames, Communicator* world, const std::string& role,
             const std::string& run, std::function<void()> on_abort);
  ~JobControl();

  // A student: true when this rank must stop before step `steps_done` (its run's agreed stop step is
  // reached).
  bool stop_at(int64_t steps_done);
  // A teacher stage: the runs it serves (names as their students' `run`; "" for a job of one run)
  // with the steps [first, end) it serves each, before the job can stop; then at every global step
  // it begins, each run's agreed stop step once decided (negative: at the run's first step).
  struct ServedSteps {
    std::string run;
    int64_t first_step = 0, end_step = 0;
  };
  void set_served_runs(const std::vector<ServedSteps>& runs);
  std::vector<std::optional<int64_t>> run_stops(int64_t step);
  // A student whose run leaves the job alone (the divergence guard ended it): the step its run stops
  // at, agreed with the teacher stages (at least this step + 1); the other runs go on.
  int64_t leave_run(const std::string& reason);
  // Whether this rank's run left the job that way: its students then leave with their run's code
  // (4 diverged, 5 rolled back) without ending the job.
  bool run_left() const { return run_left_; }
  void report(int64_t steps_done, int64_t stage, int64_t depth, const std::vector<std::pair<std::string, double>>& metrics,
              const std::string& phase = "train");
  // Leaves on purpose with this rank's exit code (0 finished, 3 stopped for requeue; a run that left
  // alone: 4 or 5, with its message). On the hosting rank, with DEEPEN_EXIT_CODE_FILE set
  // (slurm/lib.sh, the local study runner), the job's code (dist/control/policy.h, job_exit_code: a
  // failure wins, else a stopped run requeues, else a rollback, else a divergence, else 0) as the
  // coordinator saw every rank leave is written there: the launcher's own status does not say it
  // (mpirun's is its first non-zero rank's, and 1 after a SIGTERM; a group whose shorter run
  // finished leaves codes 0 and 3). The hosting rank returns only once every other rank has left
  // (or the job aborted), so the code is written before any rank ends its process.
  void shutdown(int exit_code, const std::string& message = "");

  // Leaves on a failure and rethrows it for main's exit code. This rank's own error (an InputError,
  // an ExitError, any other exception) goes to the coordinator with its exit code, which aborts
  // every other rank with its message and code, so the reason reaches every rank's log instead of
  // "the process died". A collective that failed because the job was aborted (another rank's
  // error, a death, the watchdog) leaves with the abort's code and reason instead.
  [[noreturn]] void leave_on_failure(std::exception_ptr failure);

 private:
  // The reason the control plane aborted this job (another rank's failure, a death, a hang): the
  // code to exit with and the sentence every rank logged.
  std::optional<std::pair<int, std::string>> aborted() const;
  void leave(int exit_code, const std::string& message);
  std::unique_ptr<control::ControlPlane> plane_;
  std::vector<std::string> served_;  // a teacher stage: the runs it serves, in order
  bool run_left_ = false;
};

struct StepReport;
struct StepTime;
// A student's step as heartbeat metrics (what /metrics shows).
void report_step(JobControl& control, const StepReport& report);
// A step's time breakdown as metrics: step_seconds and step_<part>_seconds (every rank's role).
std::vector<std::pair<std::string, double>> step_time_metrics(const StepTime& t);

}  // namespace deepen
