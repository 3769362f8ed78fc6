// The child side of the multi-process control tests: this binary re-executed as one agent with a
// simulated trainer, as a coordinator that publishes its endpoint, or as one rank under run.sbatch.
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "config/input_error.h"
#include "dist/control/control_plane.h"
#include "tests/control/loopback_job.h"

namespace deepen::control {
namespace {

using namespace test_support;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// One rank as the trainer would run it under slurm/run.sbatch: rank and world from srun's variables,
// the secret from DEEPEN_JOB_SECRET_FILE, the coordinator's host from DEEPEN_COORDINATOR; rank 0
// hosts through ControlPlane and publishes the endpoint in the run folder (the trainer would
// broadcast it over MPI). Returns the exit code: 3 after the coordinated stop.
int run_rank_child() {
  const int rank = env_int("SLURM_PROCID", 0), world = env_int("SLURM_NTASKS", 1);
  ControlOptions o;
  o.rank = rank;
  o.world = world;
  o.role = rank == 0 ? "teacher p0 s0" : "student " + std::to_string(rank - 1);
  o.secret = *secret_from_env();
  o.heartbeat_s = 0.05;
  o.watchdog_s = 5;
  o.hard_exit_after_s = 2;
  o.coordinator_bind = "127.0.0.1";
  const Endpoint where = *coordinator_from_launch_env(0, "");
  const std::string file = std::string(std::getenv("DEEPEN_RUN_DIR")) + "/control/endpoint";
  ControlPlane plane(o);
  if (rank == 0) {
    Endpoint ep = plane.host_coordinator();
    ep.host = where.host;  // "localhost" from DEEPEN_COORDINATOR, as other nodes would name it
    write_endpoint_file(file, ep);
  }
  plane.connect(wait_for_endpoint_file(file, 20));
  std::printf("CHILD READY rank %d\n", rank);
  std::fflush(stdout);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  try {
    for (int64_t s = 0; std::chrono::steady_clock::now() < limit;) {
      if (const auto stop = plane.stop_step(s); stop && s == *stop) {
        std::printf("CHILD STOP %lld\n", static_cast<long long>(s));
        std::fflush(stdout);
        plane.shutdown(kExitRequeue, "coordinated stop");
        return kExitRequeue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 0 ? 2 : 8));  // the teacher runs ahead
      ++s;
      plane.report(s, 0, 1, {{"train_loss", 1.0 / double(s)}});
    }
  } catch (const ControlError& e) {
    std::fprintf(stderr, "CHILD ABORTED %s\n", e.what());
    return 1;
  }
  return 0;
}

// The child's body: an agent with a simulated trainer loop, or a coordinator that publishes its
// endpoint in a file. It prints "CHILD ..." lines the parent reads, and exits with _Exit so that
// nothing else runs after the verdict: 3 after a coordinated stop, 1 after an abort.
TEST(ControlChild, DISABLED_Main) {
  const char* mode = std::getenv("DEEPEN_CONTROL_CHILD");
  if (!mode) GTEST_SKIP() << "only run as a child process of the control-plane tests";
  const Secret secret = *secret_from_env();
  const int world = env_int("CHILD_WORLD", 1);
  if (std::string(mode) == "coordinator") {
    LogSink log;
    CoordinatorOptions o = fast_coordinator(world, secret, log);
    o.log = nullptr;
    Coordinator c(o);
    write_endpoint_file(std::getenv("CHILD_ENDPOINT_FILE"), c.endpoint());
    std::printf("CHILD READY\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // the parent kills it
    std::_Exit(0);
  }
  if (std::string(mode) == "rank") {  // one rank of a job launched by slurm/run.sbatch
    std::_Exit(run_rank_child());
  }
  const int rank = env_int("CHILD_RANK", 0);
  LogSink unused;
  AgentOptions o = fast_agent(rank, world, secret, unused);
  o.host = "child-host-" + std::to_string(rank);
  o.log = nullptr;  // stderr: the parent checks the abort message there
  o.handle_signals = env_int("CHILD_SIGNALS", 0) == 1;
  o.hard_exit_after_s = 0.2;
  Agent agent(o);
  agent.connect(parse_endpoint(std::getenv("CHILD_ENDPOINT"), "CHILD_ENDPOINT"));
  std::printf("CHILD READY\n");
  std::fflush(stdout);
  const int period_ms = env_int("CHILD_PERIOD_MS", 5);
  const int idle_at = env_int("CHILD_IDLE_AT", -1);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  try {
    for (int64_t s = 0; std::chrono::steady_clock::now() < limit;) {
      if (idle_at >= 0 && s >= idle_at) {  // "stuck in a collective": heartbeats go on, steps do not
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      const auto stop = agent.stop_step(s);
      if (stop && s == *stop) {
        std::printf("CHILD STOP %lld\n", static_cast<long long>(s));
        std::fflush(stdout);
        agent.shutdown(kExitRequeue, "coordinated stop");
        std::_Exit(kExitRequeue);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
      ++s;
      agent.report(s, 0, 1, {{"train_loss", 1.0 / double(s)}});
    }
  } catch (const ControlError& e) {
    std::fprintf(stderr, "CHILD ABORTED %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(agent.aborted() ? agent.aborted()->exit_code : 1);  // the abort's code, as a rank's
  }
  std::_Exit(0);
}

}  // namespace
}  // namespace deepen::control
