// BatchSource: the micro-batches of a run, derived from (step, student, index) alone.
#pragma once

#include <cstdint>
#include <vector>

#include "train/micro_batch.h"

namespace deepen {

// Implementations must be pure in their arguments: a teacher rank and a student rank asking for the
// same batch get the same ids, and a resumed run gets the batches the interrupted one would have.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Micro-batch `micro` of optimizer step `step` for data-parallel student `student`.
  virtual MicroBatch train(int64_t step, int64_t student, int64_t micro) const = 0;
  // Validation batch `index` (0 <= index < eval_batches()): the same sequences at every eval.
  virtual MicroBatch eval(int64_t index) const = 0;
  virtual int64_t eval_batches() const = 0;
  // The fixed diagnostic batch.
  virtual MicroBatch diagnostic() const = 0;
  // What makes up the micro-batch `key` names, without reading it: its split (0 train, 1 validation)
  // then the split's sequences (documents) in row order. Two runs reading the same data (the same
  // shards and packing) get the same micro-batch exactly when these are equal: a shared teacher
  // computes it once for both (dist/teacher_schedule.h).
  virtual std::vector<int64_t> identity(const BatchKey& key) const = 0;

  // The micro-batch `key` names (an eval batch carries the key's step and student).
  MicroBatch get(const BatchKey& key) const {
    if (key.kind == BatchKind::kTrain) return train(key.step, key.student, key.index);
    MicroBatch mb = key.kind == BatchKind::kEval ? eval(key.index) : diagnostic();
    mb.step = key.step;
    mb.student = key.student;
    return mb;
  }
};

}  // namespace deepen
