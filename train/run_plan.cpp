// A run's resolved decisions (see run_plan.h).
#include "train/run_plan.h"

namespace deepen {

RunPlan make_run_plan(const Config& cfg, GrowthSchedule schedule, int64_t vocab) {
  RunPlan plan;
  plan.cfg = cfg;
  plan.schedule = std::move(schedule);
  plan.counts = {cfg.parallel.students, cfg.parallel.grad_accum, eval_batch_count(cfg)};
  plan.loss = distill_loss_options(cfg.distill);
  plan.loss.kernels = cfg.student.cpu_kernels;  // the loss's CPU path follows the student's
  plan.vocab = vocab;
  return plan;
}

}  // namespace deepen
