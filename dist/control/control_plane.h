// ControlPlane: the trainer's one object for the control plane (coordinator on one rank, agent on all).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "dist/control/agent.h"
#include "dist/control/coordinator.h"
#include "dist/control/endpoint.h"
#include "dist/control/secret.h"

namespace deepen::control {

struct ControlOptions {
  int rank = 0;
  int world = 1;
  std::string host;                 // empty = gethostname()
  std::string role;                 // "teacher p0 s1", "student 3"
  std::string run;                  // the run a student trains (a shared teacher's job); "" otherwise
  Secret secret{};                  // the same on every rank: secret_from_env(), or broadcast
  double heartbeat_s = 5;
  double watchdog_s = 120;
  double connect_timeout_s = 0;     // 0 = watchdog_s
  bool handle_signals = true;       // SIGTERM, SIGUSR1 -> coordinated stop
  double hard_exit_after_s = 10;    // see AgentOptions; < 0 = never
  std::function<void(const AbortInfo&)> on_abort;  // abort the communicators here
  std::shared_ptr<TrainerActivity> activity;       // see AgentOptions::activity
  // Used only on the rank that calls host_coordinator():
  std::string coordinator_bind = "0.0.0.0";
  uint16_t coordinator_port = 0;    // 0 = a free port
  std::string advertise_host;       // empty = the bind address, or gethostname() for 0.0.0.0
  bool metrics = false;
  std::string metrics_bind = "127.0.0.1";
  uint16_t metrics_port = 0;
  double shutdown_wait_s = 0;       // hosting rank: wait for the others' Bye; 0 = watchdog_s, infinity = no limit
};

// Timings and ports from the [control] section: heartbeat_s, watchdog_s, metrics on iff
// metrics_port > 0, metrics_bind, coordinator_port. Rank, world, secret and callbacks are the
// caller's.
ControlOptions control_options(const ControlConfig& cfg, int rank, int world, const Secret& secret);

// Where the coordinator runs, from the launch environment: DEEPEN_COORDINATOR ("host" or
// "host:port", set by slurm/*.sbatch from the allocation's first node), else `slurm_host` (a host the
// caller knows runs the coordinator).
// The port comes from there, else `port` (control.coordinator_port; 0 = the hosting rank binds a
// free one and the caller broadcasts the endpoint host_coordinator() returns). nullopt when neither
// is there (a single machine: host it on rank 0, bound to 127.0.0.1). Throws InputError naming
// DEEPEN_COORDINATOR when it is malformed.
std::optional<Endpoint> coordinator_from_launch_env(uint16_t port, const std::string& slurm_host = "");

// Typical use (MPI available, rank 0 hosts):
//   Secret secret = secret_from_env() or, on rank 0, generate_secret(), then MPI_Bcast its 32 bytes;
//   ControlPlane cp(control_options(cfg.control, rank, world, secret));
//   std::string ep = rank == 0 ? cp.host_coordinator().str() : "";  // then MPI_Bcast ep
//   cp.connect(parse_endpoint(ep, "coordinator"));
//   for (int64_t step = start;; ++step) {
//     if (auto s = cp.stop_step(step); s && step == *s) { save(step); cp.shutdown(kExitRequeue); return 3; }
//     train_step(); cp.report(step + 1, stage, depth, {{"train_loss", loss}});
//   }
//   cp.shutdown(kExitOk);
class ControlPlane {
 public:
  explicit ControlPlane(ControlOptions options);
  ~ControlPlane();  // without shutdown(): the others see this rank die and abort

  // On exactly one rank, before anyone connects: starts the coordinator (and /metrics) and returns
  // the endpoint to publish. Throws std::runtime_error if it cannot listen.
  Endpoint host_coordinator();

  // On every rank (the hosting one too). Throws ControlError on failure.
  void connect(const Endpoint& coordinator);

  void report(int64_t step, int64_t stage, int64_t depth, const Metrics& metrics = {},
              const std::string& phase = "train");
  std::optional<int64_t> stop_step(int64_t step);  // see Agent::stop_step
  RunSteps stop_steps(int64_t step);               // see Agent::stop_steps (a teacher stage)
  void set_served_runs(std::vector<ServedRun> runs);
  void request_stop(const std::string& reason);
  int64_t leave_run(const std::string& reason);     // see Agent::leave_run
  std::optional<AbortInfo> aborted() const;

  // Bye with the exit code; on the hosting rank, then waits (up to shutdown_wait_s) for every rank
  // to leave before closing the coordinator, so nobody mistakes its end for a crash.
  void shutdown(int exit_code, const std::string& message = {});

  Coordinator* coordinator();  // null unless host_coordinator() was called here
  std::optional<Endpoint> metrics_endpoint() const;

 private:
  ControlOptions opt_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Agent> agent_;
};

}  // namespace deepen::control
