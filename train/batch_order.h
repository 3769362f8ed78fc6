// Batch order: which micro-batch goes to which student, and in which order a student consumes them.
// The teacher pipeline produces in this order (dist/teacher_pipeline.cpp) and the trainer consumes
// in it (train/student_trainer.cpp); both call step_batches, so neither can drift from the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "curriculum/growth_schedule.h"

namespace deepen {

// Every rank can rebuild any micro-batch from (kind, step, student, index) through the sampler, so
// a teacher never has to be told which sequences to run: it derives them, and sends the checksum
// of the ids it used with its logits so the student can prove both sides agree.
enum class BatchKind : uint8_t { kTrain = 0, kEval = 1, kDiagnostic = 2 };

// One micro-batch, as both sides name it (the logit channel's header carries it).
struct BatchKey {
  BatchKind kind = BatchKind::kTrain;
  int64_t step = 0;     // optimizer step (train) or the step the eval runs after
  int64_t student = 0;  // data-parallel student rank it belongs to
  int64_t index = 0;    // micro-batch within the step (train) or eval batch number
  std::string describe() const;  // "train step 12 student 1 micro 0", "eval step 3 student 0 batch 2"
  bool operator==(const BatchKey&) const = default;
};

// The counts the order depends on.
struct BatchCounts {
  int64_t students = 1;      // S: data-parallel student ranks
  int64_t grad_accum = 1;    // train micro-batches per student per optimizer step
  int64_t eval_batches = 0;  // validation micro-batches per eval
};

// Validation micro-batches per eval: eval.batches, or with data.valid_documents = N (documents
// mode) as many as cover the N documents, ceil(N / parallel.micro_batch), the last one holding
// the remainder. Example: N = 4833, micro_batch 8 -> 605 batches, the last of 1 document.
int64_t eval_batch_count(const Config& cfg);

// Eval batch i is evaluated by student i mod S, so S students split an eval without overlap and
// the sum over students equals the single-process eval.
inline int64_t eval_batch_owner(int64_t batch, int64_t students) { return batch % students; }

// The micro-batches of students [first_student, first_student + count) around optimizer step
// `step`, in the order they are produced and consumed: first every train micro-batch of the step
// (micro-batch-major: every student's micro-batch 0, then every student's 1, ...), then, when an
// eval follows the step (`eval_after`), the eval
// batches those students own, in batch order. A pipeline serving students [first, first + count)
// produces exactly this list; each of its students consumes the sub-list with its own id, in the
// same order (count = 1 gives it directly). Diagnostic batches never travel: the student computes
// them without teacher targets.
//
// Worked example: S = 2 students on one pipeline, grad_accum = 2, eval.batches = 3, eval after step 3:
//   step_batches({2, 2, 3}, 3, true, 0, 2) =
//     train (3, s0, m0) (3, s1, m0) (3, s0, m1) (3, s1, m1), eval (3, s0, b0) (3, s1, b1) (3, s0, b2)
//   student 1 consumes step_batches({2, 2, 3}, 3, true, 1, 1) =
//     train (3, s1, m0) (3, s1, m1), eval (3, s1, b1)
// Every item of step k is produced before any of step k+1, so a student waiting in step k's
// all-reduce never waits on an item the teacher holds back: no deadlock, whatever the students'
// relative speed. Likewise every student's micro-batch m comes before any student's m + 1, so
// students that meet in collectives inside each micro-batch (parallel.sharding = "full" gathers
// every block in its forward and backward) never wait on a teacher that is blocked sending a later
// micro-batch to one of them (with student-major order it was: student 0's micro-batch 1 held back
// student 1's micro-batch 0 while student 0 waited for student 1 in a block's all-gather).
std::vector<BatchKey> step_batches(const BatchCounts& counts, int64_t step, bool eval_after,
                                   int64_t first_student, int64_t count);

// After step `step` (0-based): every eval.every steps and at the end of every stage.
// Example: eval.every = 4, stages of 3 steps: evals after steps 2, 3, 5, 7, 8.
inline bool is_eval_step(const Config& cfg, const GrowthSchedule& schedule, int64_t step) {
  return (step + 1) % cfg.eval.every == 0 || schedule.is_stage_end(step);
}

}  // namespace deepen
