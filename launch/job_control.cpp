// Control plane of a job: secret and endpoint distribution over MPI, stop checks, heartbeats.
#include "launch/job_control.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <ATen/ATen.h>

#include "dist/communicator.h"
#include "dist/control/control_plane.h"
#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"
#include "train/student_trainer.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

// Sends rank 0's bytes to every rank (no-op without a world). The tensors go on the world's device
// (NCCL moves only device memory) and come back to the host to be read.
void share(Communicator* world, std::string& bytes) {
  if (!world || world->size() == 1) return;
  const at::Device wire = world->device();
  at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), at::TensorOptions().dtype(at::kLong).device(wire));
  world->broadcast(size, 0);
  at::Tensor buf = at::zeros({size.item<int64_t>()}, at::kByte);
  if (world->rank() == 0) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
  at::Tensor on_wire = buf.to(wire);
  world->broadcast(on_wire, 0);
  buf = on_wire.to(at::kCPU);
  bytes.assign(static_cast<const char*>(buf.data_ptr()), static_cast<size_t>(buf.numel()));
}

}  // namespace

JobControl::JobControl(const ControlConfig& control, const std::string& job_dir, int rank, int world_size,
                       const std::vector<std::string>& hostnames, Communicator* world, const std::string& role,
                       const std::string& run, std::function<void()> on_abort) {
  std::string secret_bytes;
  if (auto env = control::secret_from_env()) {
    secret_bytes.assign(reinterpret_cast<const char*>(env->data()), env->size());
  } else if (rank == 0) {
    const control::Secret s = control::generate_secret();
    fs::create_directories(job_dir);
    control::write_secret_file(RunFolder(job_dir).control_secret(), s);
    secret_bytes.assign(reinterpret_cast<const char*>(s.data()), s.size());
  }
  share(world, secret_bytes);
  control::Secret secret{};
  std::memcpy(secret.data(), secret_bytes.data(), std::min(secret.size(), secret_bytes.size()));

  control::ControlOptions options = control::control_options(control, rank, world_size, secret);
  options.role = role;
  options.run = run;
  options.hard_exit_after_s = std::max(1.0, control.watchdog_s / 2);
  options.on_abort = [on_abort](const control::AbortInfo&) { on_abort(); };
  // One machine: the coordinator listens on loopback only. Several: on every interface, advertised
  // by this host's name (or where DEEPEN_COORDINATOR / Slurm's first node says).
  const bool one_host = std::all_of(hostnames.begin(), hostnames.end(),
                                    [&](const std::string& h) { return h == hostnames.front(); });
  options.coordinator_bind = one_host ? "127.0.0.1" : "0.0.0.0";
  if (auto launch = control::coordinator_from_launch_env(static_cast<uint16_t>(control.coordinator_port))) {
    options.coordinator_port = launch->port;
    if (!one_host) options.advertise_host = launch->host;
  }
  plane_ = std::make_unique<control::ControlPlane>(options);
  std::string endpoint;
  if (rank == 0) endpoint = plane_->host_coordinator().str();
  share(world, endpoint);
  plane_->connect(control::parse_endpoint(endpoint, "coordinator endpoint"));
  if (rank == 0) {
    if (auto m = plane_->metrics_endpoint()) std::cerr << "deepen: metrics at http://" << m->str() << "/metrics\n";
  }
}

JobControl::~JobControl() = default;

bool JobControl::stop_at(int64_t steps_done) {
  const auto s = plane_->stop_step(steps_done);
  return s && steps_done >= *s;
}

void JobControl::report(int64_t steps_done, int64_t stage, int64_t depth,
                        const std::vector<std::pair<std::string, double>>& metrics, const std::string& phase) {
  plane_->report(steps_done, stage, depth, control::Metrics(metrics.begin(), metrics.end()), phase);
}

void JobControl::shutdown(int exit_code) { plane_->shutdown(exit_code); }

std::vector<std::pair<std::string, double>> step_time_metrics(const StepTime& t) {
  std::vector<std::pair<std::string, double>> out = {{"step_seconds", t.seconds}};
  for (const auto& [part, s] : t.parts) out.emplace_back("step_" + part + "_seconds", s);
  return out;
}

void report_step(JobControl& control, const StepReport& r) {
  std::vector<std::pair<std::string, double>> metrics = {
      {"train_loss", r.loss}, {"train_kl", r.kl}, {"train_ce", r.ce}, {"lr", r.lr},
      {"tokens_per_s", r.tokens_per_s}, {"channel_bytes_per_s", r.channel_bytes_per_s}};
  for (const auto& m : step_time_metrics({r.step, "student", r.step_seconds, r.time_parts})) metrics.push_back(m);
  if (r.last_eval_ce >= 0) metrics.emplace_back("eval_ce", r.last_eval_ce);
  if (r.last_eval_kl >= 0) metrics.emplace_back("eval_kl", r.last_eval_kl);
  control.report(r.step + 1, r.stage, r.depth, metrics);
}

}  // namespace deepen
