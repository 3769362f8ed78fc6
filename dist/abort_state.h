// AbortState: the abort flag a communicator shares with its requests and the communicators split from
// it, so one abort() from a watchdog thread reaches every blocked call (internal to dist/).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "dist/control/activity.h"

namespace deepen {

class AbortState {
 public:
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Sets the flag, runs the backend's hook (NCCL: ncclCommAbort) once, then aborts every child.
  void abort() {
    std::vector<std::weak_ptr<AbortState>> children;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
      if (on_abort_) on_abort_();
      on_abort_ = nullptr;
      children.swap(children_);
    }
    for (auto& weak : children)
      if (auto child = weak.lock()) child->abort();
  }

  // A child made by split(): aborted with this one (at once if this one already is), and reporting
  // its waits to the same trainer activity.
  void adopt(const std::shared_ptr<AbortState>& child) {
    bool now = false;
    std::shared_ptr<control::TrainerActivity> activity;
    {
      std::lock_guard<std::mutex> lock(mu_);
      activity = activity_;
      if (aborted_.load()) now = true;
      else children_.push_back(child);
    }
    child->set_activity(activity);
    if (now) child->abort();
  }

  // Where this communicator and every one split from it (before or after) mark their blocking
  // waits and posted device operations (dist/control/activity.h); null = nowhere.
  void set_activity(const std::shared_ptr<control::TrainerActivity>& activity) {
    std::vector<std::weak_ptr<AbortState>> children;
    {
      std::lock_guard<std::mutex> lock(mu_);
      activity_ = activity;
      children = children_;
    }
    for (auto& weak : children)
      if (auto child = weak.lock()) child->set_activity(activity);
  }
  control::TrainerActivity* activity() const {
    std::lock_guard<std::mutex> lock(mu_);
    return activity_.get();
  }

  // The backend's hook, run once by the first abort(). A communicator clears it (nullptr) before it
  // frees what the hook uses: once that returns, the hook has either run to completion or never will.
  void set_on_abort(std::function<void()> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    on_abort_ = std::move(hook);
  }

 private:
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::shared_ptr<control::TrainerActivity> activity_;
  std::function<void()> on_abort_;
  std::vector<std::weak_ptr<AbortState>> children_;
};

}  // namespace deepen
