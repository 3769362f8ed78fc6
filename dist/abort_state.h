// AbortState: the abort flag a communicator shares with its requests and the communicators split from
// it, so one abort() from a watchdog thread reaches every blocked call (internal to dist/).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

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

  // A child made by split(): aborted with this one (at once if this one already is).
  void adopt(const std::shared_ptr<AbortState>& child) {
    bool now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.load()) now = true;
      else children_.push_back(child);
    }
    if (now) child->abort();
  }

  // The backend's hook, run once by the first abort(). A communicator clears it (nullptr) before it
  // frees what the hook uses: once that returns, the hook has either run to completion or never will.
  void set_on_abort(std::function<void()> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    on_abort_ = std::move(hook);
  }

 private:
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::function<void()> on_abort_;
  std::vector<std::weak_ptr<AbortState>> children_;
};

}  // namespace deepen
