// TeacherSource: where a student gets its teacher targets (a local teacher, or a logit channel).
#pragma once

#include <memory>

#include "train/distill_loss.h"
#include "train/micro_batch.h"

namespace deepen {

class TeacherStage;

// The trainer asks for the targets of each micro-batch it is about to train or evaluate on, in
// the order of the schedule. A remote source (dist/) checks the checksum that came with them.
class TeacherSource {
 public:
  virtual ~TeacherSource() = default;
  virtual TeacherTargets targets(const MicroBatch& batch) = 0;
  // Says which micro-batch targets() will be asked for next, before the trainer computes the
  // current one: a remote source starts receiving it (dist/logit_channel.h). Each batch is
  // prefetched at most once, in the order targets() will ask for them; a local teacher ignores it.
  virtual void prefetch(const MicroBatch& next) { (void)next; }
  // "full", "topk:<k>:<tail>" or "hidden", recorded in the run's metadata.
  virtual std::string describe() const = 0;
  // Bytes that arrived over a logit channel so far (0 for an in-process teacher).
  virtual int64_t channel_bytes() const { return 0; }
};

// A whole teacher in this process. Full logits, or top-k made with teacher_topk when k > 0; or,
// when `head` is given (distill.logits = "hidden", the teacher loaded without its head), its final
// hidden states with that head, as a hidden-state channel delivers them (eval batches too).
class LocalTeacher : public TeacherSource {
 public:
  LocalTeacher(std::shared_ptr<TeacherStage> teacher, int64_t topk, double temperature, TopkTail tail,
               int64_t vocab_chunk, at::Tensor head = {});
  TeacherTargets targets(const MicroBatch& batch) override;
  std::string describe() const override;

 private:
  std::shared_ptr<TeacherStage> teacher_;
  int64_t topk_;
  double temperature_;
  TopkTail tail_;
  int64_t vocab_chunk_;
  at::Tensor head_;
};

}  // namespace deepen
