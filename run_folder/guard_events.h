// guard.jsonl: what the divergence guard did in a run (train/divergence_guard.h), and the LR scale its
// rollbacks left for the next start.
#pragma once

#include <cstdint>
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

}  // namespace deepen
