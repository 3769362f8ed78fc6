// Teacher schedule: the distinct micro-batches a teacher pipeline computes at a step, in the order
// it produces them, and which runs' students receive each one.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "train/batch_order.h"

namespace deepen {

// One run as a teacher pipeline sees it. A lone run is one of these; runs sharing the teacher are
// several, each with its own steps, evals and data stream (the sharing rule is
// study/teacher_groups.h's: same data, batches and order, so equal positions usually hold equal
// micro-batches).
struct ScheduledRun {
  BatchCounts counts;                   // its students, micro-batches per step, eval batches
  int64_t first_step = 0;               // steps [first_step, end_step) are still to train
  int64_t end_step = 0;
  std::function<bool(int64_t step)> eval_after;                        // an eval follows the step
  std::function<std::vector<int64_t>(const BatchKey&)> identity;      // BatchSource::identity
  bool active(int64_t step) const { return step >= first_step && step < end_step; }
};

// Run `run`'s student receives the item under `key` (its own name for it: the key its trainer asks
// for, which the channel's header carries).
struct Delivery {
  int run = 0;
  BatchKey key;
};

// One forward pass of the teacher: the micro-batch at `key` (its first receiver's key, which the
// pipeline's stages pass along), and everyone who gets its output.
struct TeacherItem {
  BatchKey key;
  std::vector<Delivery> to;
};

// The items pipeline `pipeline` (serving students [first_student, first_student + count) of every
// run) produces for step `step`. The order is step_batches' (train batches micro-batch-major, then
// the eval batches by index) over the union of the active runs' batches, so every student receives
// its own batches in the order it consumes them. At each position the active runs that have a batch
// there are grouped by its identity: equal micro-batches are one item delivered to each of them;
// a run whose stream has parted from the others' (its identity differs) gets an item of its own.
//
// Worked example: two runs, 1 student, 2 micro-batches per step, 1 eval batch; run 1 evaluates
// after step 4, run 0 does not; their data agree except run 1's micro-batch 1 at step 4:
//   teacher_items(runs, 4, 0, 1) =
//     train (4, s0, m0) -> run 0 (4, s0, m0), run 1 (4, s0, m0)      one pass, two deliveries
//     train (4, s0, m1) -> run 0 (4, s0, m1)                         parted: one pass each
//     train (4, s0, m1) -> run 1 (4, s0, m1)
//     eval  (4, s0, b0) -> run 1 (4, s0, b0)
// A run outside its [first_step, end_step) has nothing at the step; no active run: no items.
std::vector<TeacherItem> teacher_items(const std::vector<ScheduledRun>& runs, int64_t step, int64_t first_student,
                                       int64_t count);

}  // namespace deepen
