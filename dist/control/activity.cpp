// TrainerActivity: communicator waits and pending device operations marked by the trainer thread,
// its CPU clock read by the agent's.
#include "dist/control/activity.h"

#include <pthread.h>

namespace deepen::control {

TrainerActivity::TrainerActivity() : last_wall_(std::chrono::steady_clock::now()) {
  has_cpu_clock_ = pthread_getcpuclockid(pthread_self(), &cpu_clock_) == 0;
  last_cpu_s_ = trainer_cpu_seconds();
}

double TrainerActivity::trainer_cpu_seconds() const {
  timespec ts{};
  if (!has_cpu_clock_ || clock_gettime(cpu_clock_, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TrainerActivity::Wait::Wait(TrainerActivity* activity, std::string what) : activity_(activity) {
  if (!activity_) return;
  std::lock_guard lock(activity_->mu_);
  if (activity_->depth_++ == 0) activity_->what_ = std::move(what);
}

TrainerActivity::Wait::~Wait() {
  if (!activity_) return;
  std::lock_guard lock(activity_->mu_);
  if (--activity_->depth_ == 0) activity_->what_.clear();
}

void TrainerActivity::pending(std::string what, std::function<bool()> finished) {
  std::lock_guard lock(mu_);
  // Finished ones leave from the front, so a rank posting thousands between two heartbeats keeps
  // only the unfinished tail.
  while (!pending_.empty() && pending_.front().finished()) pending_.pop_front();
  pending_.push_back(Pending{std::move(what), std::move(finished)});
}

TrainerActivity::Sample TrainerActivity::sample(double min_cpu_share) {
  const auto now = std::chrono::steady_clock::now();
  const double cpu = trainer_cpu_seconds();
  const double wall = std::chrono::duration<double>(now - last_wall_).count();
  const double used = cpu - last_cpu_s_;
  last_wall_ = now;
  last_cpu_s_ = cpu;
  std::lock_guard lock(mu_);
  if (depth_ > 0) return {State::kWaiting, what_};
  while (!pending_.empty() && pending_.front().finished()) pending_.pop_front();
  if (!pending_.empty()) return {State::kWaiting, pending_.front().what + " (posted, unfinished)"};
  // No CPU clock (not on Linux): a rank outside any wait counts as computing, as before it had one.
  if (has_cpu_clock_ && used < min_cpu_share * wall) return {State::kBlocked, ""};
  return {State::kComputing, ""};
}

}  // namespace deepen::control
