// LocalTeacher: the whole teacher in the student's process (single-process runs and tests).
#include "train/teacher_source.h"

#include <ATen/ATen.h>

#include "model/teacher_stage.h"

namespace deepen {

LocalTeacher::LocalTeacher(std::shared_ptr<TeacherStage> teacher, int64_t topk, double temperature, TopkTail tail,
                           int64_t vocab_chunk, at::Tensor head)
    : teacher_(std::move(teacher)),
      topk_(topk),
      temperature_(temperature),
      tail_(tail),
      vocab_chunk_(vocab_chunk),
      head_(std::move(head)) {}

TeacherTargets LocalTeacher::targets(const MicroBatch& batch) {
  at::Tensor logits = teacher_->forward(batch.inputs.to(teacher_->device()));
  logits = logits.reshape({-1, logits.size(-1)});
  // Headless teacher: these are its final hidden states; the loss makes the logits chunk by chunk.
  if (head_.defined()) return TeacherTargets::from_hidden(logits, head_);
  // Eval and diagnostic batches get full logits: validation KL is reported exactly, at τ = 1.
  if (topk_ > 0 && batch.kind == BatchKind::kTrain) return teacher_topk(logits, topk_, temperature_, vocab_chunk_);
  return TeacherTargets::full(logits);
}

std::string LocalTeacher::describe() const {
  if (head_.defined()) return "hidden";
  if (topk_ <= 0) return "full";
  return "topk:" + std::to_string(topk_) + ":" + option_name(tail_);
}

}  // namespace deepen
