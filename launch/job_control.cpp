// Control plane of a job: secret and endpoint distribution over MPI, stop checks, heartbeats.
#include "launch/job_control.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <iostream>

#include <ATen/ATen.h>

#include "config/input_error.h"
#include "config/text_file.h"
#include "dist/communicator.h"
#include "dist/control/control_plane.h"
#include "launch/job_parts.h"
#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"
#include "train/student_trainer.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

// "pre-grow 0, post-grow 3, joint 4": each run's students' code (a job of one run: "the run 3").
std::string describe_run_codes(const std::vector<control::RankView>& ranks) {
  std::vector<std::pair<std::string, int>> runs;
  for (const control::RankView& r : ranks) {
    if (control::is_teacher_role(r.role)) continue;
    const std::string name = r.run.empty() ? "the run" : r.run;
    if (std::none_of(runs.begin(), runs.end(), [&](const auto& x) { return x.first == name; }))
      runs.emplace_back(name, r.exit_code);
  }
  std::string out;
  for (const auto& [name, code] : runs) out += (out.empty() ? "" : ", ") + name + " " + std::to_string(code);
  return out;
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
  broadcast_bytes(world, secret_bytes);
  control::Secret secret{};
  std::memcpy(secret.data(), secret_bytes.data(), std::min(secret.size(), secret_bytes.size()));

  control::ControlOptions options = control::control_options(control, rank, world_size, secret);
  options.role = role;
  options.run = run;
  options.hard_exit_after_s = std::max(1.0, control.watchdog_s / 2);
  // The hosting rank leaves last, once every other rank has (its runs may still export their students
  // for minutes): no time limit on that wait, since the watchdog ends the job if one of them hangs.
  options.shutdown_wait_s = std::numeric_limits<double>::infinity();
  options.on_abort = [on_abort](const control::AbortInfo&) { on_abort(); };
  // Made here, on the trainer thread (the one that runs the job), whose CPU clock it reads; the
  // communicators mark their waits in it, so a long step is not taken for a hang.
  options.activity = std::make_shared<control::TrainerActivity>();
  if (world) world->set_activity(options.activity);
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
  broadcast_bytes(world, endpoint);
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

void JobControl::set_served_runs(const std::vector<ServedSteps>& runs) {
  std::vector<control::ServedRun> served;
  served_.clear();
  for (const ServedSteps& r : runs) {
    served.push_back({r.run, r.first_step, r.end_step});
    served_.push_back(r.run);
  }
  plane_->set_served_runs(std::move(served));
}

std::vector<std::optional<int64_t>> JobControl::run_stops(int64_t step) {
  const control::RunSteps decided = plane_->stop_steps(step);
  std::vector<std::optional<int64_t>> out;
  for (const std::string& run : served_) out.push_back(control::run_step(decided, run));
  return out;
}

int64_t JobControl::leave_run(const std::string& reason) {
  const int64_t step = plane_->leave_run(reason);
  run_left_ = true;
  return step;
}

void JobControl::report(int64_t steps_done, int64_t stage, int64_t depth,
                        const std::vector<std::pair<std::string, double>>& metrics, const std::string& phase) {
  plane_->report(steps_done, stage, depth, control::Metrics(metrics.begin(), metrics.end()), phase);
}

void JobControl::shutdown(int exit_code, const std::string& message) { leave(exit_code, message); }

void JobControl::leave(int exit_code, const std::string& message) {
  plane_->shutdown(exit_code, message);
  control::Coordinator* coordinator = plane_->coordinator();
  if (!coordinator) return;
  const char* file = std::getenv("DEEPEN_EXIT_CODE_FILE");
  // The job's code: an abort's (the failed rank's own code, lent to all), or the rule over the
  // codes every rank left with (policy.h, job_exit_code).
  std::optional<int> job_code;
  if (const auto abort = coordinator->aborted()) {
    job_code = abort->exit_code;
  } else {
    const std::vector<control::RankView> ranks = coordinator->ranks();
    job_code = control::job_exit_code(ranks);
  }
  if (!job_code) return;  // a rank that never left: the launcher's status stands
  // Ranks that left with codes of their own (a group's runs end apart): a launcher's status names one
  // of them, so the job's says which counts.
  const std::vector<control::RankView> ranks = coordinator->ranks();
  const bool mixed = std::any_of(ranks.begin(), ranks.end(),
                                 [&](const control::RankView& r) { return r.exit_code != ranks.front().exit_code; });
  if (mixed && !coordinator->aborted())
    std::cerr << "deepen: the job's exit code is " << *job_code << " (its runs: "
              << describe_run_codes(ranks) << ")" << (file && *file ? std::string(", written to ") + file : "") << "\n";
  if (!file || !*file) return;
  try {
    write_file_text(file, std::to_string(*job_code) + "\n", "the job's exit code");
  } catch (const std::exception& e) {
    std::cerr << "deepen: " << e.what() << "\n";  // the launcher's own status still stands
  }
}

std::optional<std::pair<int, std::string>> JobControl::aborted() const {
  if (auto info = plane_->aborted()) return std::make_pair(info->exit_code, info->message);
  return std::nullopt;
}

void JobControl::leave_on_failure(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const InputError& e) {  // this rank's own reason: the others learn it
    leave(kExitBadInput, e.what());
    throw;
  } catch (const ExitError& e) {
    leave(e.code(), e.what());
    throw;
  } catch (const std::exception& e) {
    // A collective that failed because the job was aborted (another rank's error, a death, the
    // watchdog): the abort's reason and code are this rank's too.
    if (const auto abort = aborted()) {
      leave(abort->first, abort->second);
      throw ExitError(abort->first, "the job stopped: " + abort->second);
    }
    leave(kExitFailure, e.what());
    throw;
  }
}

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
