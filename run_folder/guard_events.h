// guard.jsonl: what the divergence guard did in a run (train/divergence_guard.h), and the LR scale its
// rollbacks left for the next start.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace deepen {

// One line per event, appended by student 0 as it happens. Unlike metrics.jsonl it is never cut back
// on resume: it is the history of the run's recoveries, steps redone or not. A fresh start removes it.
//   {"step": 12, "event": "skipped", "quantity": "loss", "value": "nan", "reason": "the loss is nan on ..."}
//   {"step": 40, "event": "rolled_back", ..., "checkpoint": "<dir>", "lr_scale": 0.5, "rollbacks": 1}
//   {"step": 41, "event": "stopped", ...}
// Non-finite values are written as strings ("nan", "inf"): a JSON null would say nothing.
void append_guard_event(const std::string& run_dir, const nlohmann::json& event);

// What the run's rollbacks left: the LR scale the next start trains with (the product of their
// guard.rollback_lr_factor) and how many there were; {1, 0} without a guard.jsonl.
struct RollbackState {
  double lr_scale = 1;
  int64_t rollbacks = 0;
};
RollbackState read_rollback_state(const std::string& run_dir);

// The guard's last stop of the run ("stopped": guard.action = "stop", or a weight that is not
// finite), if the run has not trained past it since: its newest checkpoint is from before that step.
// Resuming with the same LR repeats the divergence step for step, so a study or a shared teacher's
// group does not rerun such a run unless its LR scale changed (lr_scale: the one it diverged with,
// guard.lr_scale x its rollbacks'; absent in records of earlier versions).
struct GuardStop {
  int64_t step = 0;
  std::optional<double> lr_scale;
  std::string reason;
};
std::optional<GuardStop> read_guard_stop(const std::string& run_dir);

// The sentence saying why a diverged run is not rerun, or nullopt when it may run: it has not
// diverged (or trained past it since), or `guard_lr_scale` (its config's guard.lr_scale, times its
// rollbacks' scale) differs from the LR scale it diverged with: a retry at another LR.
std::optional<std::string> unretried_divergence(const std::string& run_dir, const std::string& run_name,
                                                double guard_lr_scale);

}  // namespace deepen
