// ControlPlane: wires a Coordinator (hosting rank only) and an Agent (every rank) from one option set.
#include "dist/control/control_plane.h"

namespace deepen::control {

ControlOptions control_options(const ControlConfig& cfg, int rank, int world, const Secret& secret) {
  ControlOptions o;
  o.rank = rank;
  o.world = world;
  o.secret = secret;
  o.heartbeat_s = cfg.heartbeat_s;
  o.watchdog_s = cfg.watchdog_s;
  o.metrics = cfg.metrics_port > 0;
  o.metrics_bind = cfg.metrics_bind;
  o.metrics_port = uint16_t(cfg.metrics_port);
  o.coordinator_port = uint16_t(cfg.coordinator_port);
  return o;
}

std::optional<Endpoint> coordinator_from_launch_env(uint16_t port, const std::string& slurm_host) {
  if (auto ep = coordinator_from_env()) {
    if (ep->port == 0) ep->port = port;
    return ep;
  }
  if (!slurm_host.empty()) return Endpoint{slurm_host, port};
  return std::nullopt;
}

ControlPlane::ControlPlane(ControlOptions options) : opt_(std::move(options)) {
  if (opt_.connect_timeout_s <= 0) opt_.connect_timeout_s = opt_.watchdog_s;
  if (opt_.shutdown_wait_s <= 0) opt_.shutdown_wait_s = opt_.watchdog_s;
  AgentOptions a;
  a.rank = opt_.rank;
  a.world = opt_.world;
  a.host = opt_.host;
  a.role = opt_.role;
  a.run = opt_.run;
  a.secret = opt_.secret;
  a.heartbeat_s = opt_.heartbeat_s;
  a.watchdog_s = opt_.watchdog_s;
  a.connect_timeout_s = opt_.connect_timeout_s;
  a.handle_signals = opt_.handle_signals;
  a.on_abort = opt_.on_abort;
  a.activity = opt_.activity;
  a.hard_exit_after_s = opt_.hard_exit_after_s;
  agent_ = std::make_unique<Agent>(std::move(a));
}

ControlPlane::~ControlPlane() {
  agent_.reset();
  coordinator_.reset();
}

Endpoint ControlPlane::host_coordinator() {
  CoordinatorOptions c;
  c.world = opt_.world;
  c.host_rank = opt_.rank;
  c.secret = opt_.secret;
  c.bind = opt_.coordinator_bind;
  c.port = opt_.coordinator_port;
  c.advertise_host = opt_.advertise_host;
  c.heartbeat_s = opt_.heartbeat_s;
  c.watchdog_s = opt_.watchdog_s;
  c.connect_timeout_s = opt_.connect_timeout_s;
  c.metrics = opt_.metrics;
  c.metrics_bind = opt_.metrics_bind;
  c.metrics_port = opt_.metrics_port;
  coordinator_ = std::make_unique<Coordinator>(std::move(c));
  return coordinator_->endpoint();
}

void ControlPlane::connect(const Endpoint& coordinator) { agent_->connect(coordinator); }

void ControlPlane::report(int64_t step, int64_t stage, int64_t depth, const Metrics& metrics,
                          const std::string& phase) {
  agent_->report(step, stage, depth, metrics, phase);
}

std::optional<int64_t> ControlPlane::stop_step(int64_t step) { return agent_->stop_step(step); }
RunSteps ControlPlane::stop_steps(int64_t step) { return agent_->stop_steps(step); }
void ControlPlane::set_served_runs(std::vector<ServedRun> runs) { agent_->set_served_runs(std::move(runs)); }
int64_t ControlPlane::leave_run(const std::string& reason) { return agent_->leave_run(reason); }

void ControlPlane::request_stop(const std::string& reason) { agent_->request_stop(reason); }

std::optional<AbortInfo> ControlPlane::aborted() const { return agent_->aborted(); }

void ControlPlane::shutdown(int exit_code, const std::string& message) {
  agent_->shutdown(exit_code, message);
  if (coordinator_) {
    coordinator_->wait_all_done(opt_.shutdown_wait_s);
    coordinator_->stop();
  }
}

Coordinator* ControlPlane::coordinator() { return coordinator_.get(); }

std::optional<Endpoint> ControlPlane::metrics_endpoint() const {
  return coordinator_ ? coordinator_->metrics_endpoint() : std::nullopt;
}

}  // namespace deepen::control
