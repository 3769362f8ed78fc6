// Evaluation: validation CE and KL over the eval batches this student owns, summed over students.
#include <cmath>
#include <vector>

#include <ATen/ATen.h>

#include "train/batch_source.h"
#include "train/student_group.h"
#include "train/teacher_source.h"
#include "train/trainer.h"

namespace deepen {

void Trainer::evaluate(int64_t step, int stage, bool stage_end, const std::vector<BatchKey>& batches) {
  at::NoGradGuard no_grad;
  double sums[3] = {0, 0, 0};  // kl·n, ce·n, n
  std::vector<BatchKey> mine;  // only this student's: step_batches gave them
  for (const BatchKey& key : batches)
    if (key.kind == BatchKind::kEval) mine.push_back(key);
  // Each carries step and student: identifies it on a channel. Batch j + 1's targets are prefetched
  // while batch j computes (see Trainer::train_step).
  MicroBatch next = mine.empty() ? MicroBatch{} : run_.batches->get(mine[0]);
  for (size_t j = 0; j < mine.size(); ++j) {
    const MicroBatch mb = std::move(next);
    const TeacherTargets targets = run_.teacher ? take_targets(mb) : TeacherTargets::none();
    if (j + 1 < mine.size()) {
      next = run_.batches->get(mine[j + 1]);
      if (run_.teacher) run_.teacher->prefetch(next);
    }
    const at::Tensor hidden = student_->forward_hidden(mb.inputs.to(device_));
    const DistillLoss l =
        distill_loss(hidden, student_->head_parameter(), targets, mb.labels.to(device_), eval_options_, &loss_workspace_);
    const double n = static_cast<double>(l.tokens.item<int64_t>());
    sums[0] += l.kl.item<double>() * n;
    sums[1] += l.ce.item<double>() * n;
    sums[2] += n;
  }
  const std::vector<double> total = group_.sum({sums[0], sums[1], sums[2]});
  progress_.last_eval_kl = run_.teacher ? total[0] / total[2] : -1;
  progress_.last_eval_ce = total[1] / total[2];
  if (records_) {
    nlohmann::json record = {{"step", step},
                             {"stage", stage},
                             {"depth", student_->depth()},
                             {"stage_end", stage_end},
                             {"tokens", progress_.tokens},
                             {"active_layer_tokens", progress_.active_layer_tokens},
                             {"val_ce", progress_.last_eval_ce},
                             // Perplexity of the same tokens: exp of their mean CE.
                             {"val_ppl", std::exp(progress_.last_eval_ce)},
                             {"val_tokens", total[2]}};
    record["val_kl"] = run_.teacher ? nlohmann::json(progress_.last_eval_kl) : nlohmann::json(nullptr);
    write_records([&] { records_->eval(record); });
  }
}

}  // namespace deepen
