// JobControl: a run's control plane (heartbeats, watchdog, coordinated stop, /metrics) set up from
// [control] and the launch environment, for single-process and distributed jobs alike.
#pragma once

#include <cstdint>
#include <functional>
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

  // True when this rank must stop before step `steps_done` (the agreed stop step is reached).
  bool stop_at(int64_t steps_done);
  void report(int64_t steps_done, int64_t stage, int64_t depth, const std::vector<std::pair<std::string, double>>& metrics,
              const std::string& phase = "train");
  // Leaves on purpose with the job's exit code (0 finished, 3 stopped for requeue).
  void shutdown(int exit_code);

 private:
  std::unique_ptr<control::ControlPlane> plane_;
};

struct StepReport;
struct StepTime;
// A student's step as heartbeat metrics (what /metrics shows).
void report_step(JobControl& control, const StepReport& report);
// A step's time breakdown as metrics: step_seconds and step_<part>_seconds (every rank's role).
std::vector<std::pair<std::string, double>> step_time_metrics(const StepTime& t);

}  // namespace deepen
