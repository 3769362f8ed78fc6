// RunPlan: one run's decisions, resolved once from its config; the trainer and the teacher take them.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "curriculum/growth_schedule.h"
#include "train/batch_order.h"
#include "train/distill_loss.h"

namespace deepen {

// launch/job_plan.cpp makes one per run before any heavy work (reading a matched run's budget
// record and the tokenizer's vocabulary there); nothing below launch/ derives these again, so the
// students and every teacher stage of a job work from the same numbers.
struct RunPlan {
  Config cfg;               // resolved and validated; a single process has its students folded into grad_accum
  GrowthSchedule schedule;  // steps per stage, budgets resolved
  BatchCounts counts;       // students, train micro-batches per student per step, eval batches per eval
  DistillLossOptions loss;  // α, τ, the top-k tail and the row chunk of distill.*; student.cpu_kernels
  int64_t vocab = 0;        // rows of the student's embedding and head

  // An eval follows step `step`: every eval.every steps and at the end of every stage.
  bool eval_after(int64_t step) const { return is_eval_step(cfg, schedule, step); }
};

// Pure, from a schedule already resolved (curriculum/growth_schedule.h). Example: students 2,
// grad_accum 2, eval.batches 3 -> counts {2, 2, 3}; with data.valid_documents = 10 and micro_batch
// 4 (documents) -> 3 eval batches.
RunPlan make_run_plan(const Config& cfg, GrowthSchedule schedule, int64_t vocab);

}  // namespace deepen
