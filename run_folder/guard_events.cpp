// guard.jsonl: appending the guard's events and reading back what its rollbacks left.
#include "run_folder/guard_events.h"

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

}  // namespace deepen
