// guard.jsonl: appending the guard's events and reading back what its rollbacks left.
#include "run_folder/guard_events.h"

#include <filesystem>

#include "run_folder/checkpoint_store.h"
#include "run_folder/jsonl.h"
#include "run_folder/run_folder.h"

namespace deepen {

void append_guard_event(const std::string& run_dir, const nlohmann::json& event) {
  JsonlWriter(RunFolder(run_dir).guard_jsonl()).append(event);
}

RollbackState read_rollback_state(const std::string& run_dir) {
  RollbackState state;
  for (const nlohmann::json& e : read_jsonl(RunFolder(run_dir).guard_jsonl())) {
    if (e.value("event", "") != "rolled_back") continue;
    state.lr_scale = e.value("lr_scale", state.lr_scale);
    state.rollbacks = e.value("rollbacks", state.rollbacks);
  }
  return state;
}

std::optional<GuardStop> read_guard_stop(const std::string& run_dir) {
  std::optional<GuardStop> stop;
  for (const nlohmann::json& e : read_jsonl(RunFolder(run_dir).guard_jsonl())) {
    if (e.value("event", "") != "stopped") continue;
    GuardStop g;
    g.step = e.value("step", int64_t{0});
    if (e.contains("lr_scale") && e["lr_scale"].is_number()) g.lr_scale = e["lr_scale"].get<double>();
    g.reason = e.value("reason", "");
    stop = g;
  }
  if (!stop) return stop;
  // Trained past it since (resumed with a lower LR): the newest checkpoint is at or after the step.
  const std::vector<std::string> checkpoints = CheckpointStore(run_dir).list();
  if (!checkpoints.empty()) {
    const std::string name = std::filesystem::path(checkpoints.back()).filename().string();
    const int64_t newest = std::stoll(name.substr(name.find('_') + 1));
    if (newest >= stop->step) return std::nullopt;
  }
  return stop;
}

std::optional<std::string> unretried_divergence(const std::string& run_dir, const std::string& run_name,
                                                double guard_lr_scale) {
  const std::optional<GuardStop> stop = read_guard_stop(run_dir);
  if (!stop) return std::nullopt;
  const double lr_scale = guard_lr_scale * read_rollback_state(run_dir).lr_scale;
  if (stop->lr_scale && *stop->lr_scale != lr_scale) return std::nullopt;
  return "run " + run_name + " diverged at step " + std::to_string(stop->step) + " (" + stop->reason + "; " +
         RunFolder(run_dir).guard_jsonl() + "); not rerun with the same LR, which would diverge the same way. "
         "To retry it, lower its LR in its own settings (guard.lr_scale=0.5)";
}

}  // namespace deepen
