// Which distinct micro-batches a teacher pipeline computes per step (see teacher_schedule.h).
#include "dist/teacher_schedule.h"

#include <stdexcept>

namespace deepen {

std::vector<TeacherItem> teacher_items(const std::vector<ScheduledRun>& runs, int64_t step, int64_t first_student,
                                       int64_t count) {
  // Positions: the union of the active runs' lists. Runs sharing a teacher have the same counts, so
  // their train positions coincide and only the eval batches differ (who evaluates after `step`).
  const ScheduledRun* counts_from = nullptr;
  bool any_eval = false;
  std::vector<bool> evaluates(runs.size(), false);
  for (size_t r = 0; r < runs.size(); ++r) {
    if (!runs[r].active(step)) continue;
    if (counts_from && (runs[r].counts.students != counts_from->counts.students ||
                        runs[r].counts.grad_accum != counts_from->counts.grad_accum ||
                        runs[r].counts.eval_batches != counts_from->counts.eval_batches))
      throw std::invalid_argument("teacher_items: runs sharing a teacher must have equal batch counts");
    if (!counts_from) counts_from = &runs[r];
    evaluates[r] = runs[r].eval_after(step);
    any_eval = any_eval || evaluates[r];
  }
  std::vector<TeacherItem> items;
  if (!counts_from) return items;
  for (const BatchKey& position : step_batches(counts_from->counts, step, any_eval, first_student, count)) {
    // Each run with a batch here joins the item of equal identity, or starts one.
    std::vector<std::vector<int64_t>> identities;
    const size_t first_item = items.size();
    for (size_t r = 0; r < runs.size(); ++r) {
      if (!runs[r].active(step) || (position.kind == BatchKind::kEval && !evaluates[r])) continue;
      std::vector<int64_t> id = runs[r].identity(position);
      size_t k = 0;
      while (k < identities.size() && identities[k] != id) ++k;
      if (k == identities.size()) {
        identities.push_back(std::move(id));
        items.push_back(TeacherItem{position, {}});
      }
      items[first_item + k].to.push_back(Delivery{static_cast<int>(r), position});
    }
  }
  return items;
}

}  // namespace deepen
