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
  // "full" or "topk:<k>:<tail>", recorded in the run's metadata.
  virtual std::string describe() const = 0;
  // Bytes that arrived over a logit channel so far (0 for an in-process teacher).
  virtual int64_t channel_bytes() const { return 0; }
};

// A whole teacher in this process. Full logits, or top-k made with teacher_topk when k > 0.
class LocalTeacher : public TeacherSource {
 public:
  LocalTeacher(std::shared_ptr<TeacherStage> teacher, int64_t topk, double temperature, TopkTail tail,
               int64_t vocab_chunk);
  TeacherTargets targets(const MicroBatch& batch) override;
  std::string describe() const override;

 private:
  std::shared_ptr<TeacherStage> teacher_;
  int64_t topk_;
  double temperature_;
  TopkTail tail_;
  int64_t vocab_chunk_;
};

}  // namespace deepen
