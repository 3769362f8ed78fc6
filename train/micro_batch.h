// MicroBatch: the token ids one student rank trains (or evaluates) on, and where they came from.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "train/batch_order.h"

namespace deepen {

// The label of a position that is not a target: right padding of unpacked documents
// (data.packing = "documents"). The loss (its ignore_index), the eval, the diagnostics and every
// token count skip it; attention needs no mask for it (causal: real queries never see a later
// padded key, and padded queries' outputs are never scored).
inline constexpr int64_t kIgnoreLabel = -1;

// The ids of one BatchKey (train/batch_order.h), rebuilt by any rank through the sampler.
struct MicroBatch {
  BatchKind kind = BatchKind::kTrain;
  int64_t step = 0;     // optimizer step (train) or the step the eval runs after
  int64_t student = 0;  // data-parallel student rank this batch belongs to
  int64_t index = 0;    // micro-batch within the step (train) or eval batch number
  at::Tensor inputs;    // [B, T] int64 (documents: T = the longest member's inputs, right-padded)
  at::Tensor labels;    // [B, T] int64: inputs shifted by one; kIgnoreLabel where padded
  uint64_t checksum = 0;  // ids_checksum(inputs)
};

// hash64 (config/hash.h) of the int64 ids, moved to a contiguous CPU tensor: what a logit channel checks.
uint64_t ids_checksum(const at::Tensor& ids);

}  // namespace deepen
