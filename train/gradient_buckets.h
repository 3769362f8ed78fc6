// GradientBuckets: the students' gradient reduction in flat buckets, each launched as soon as the
// backward pass has finished its gradients (overlapped with the rest of the backward), or all
// after it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/shard_layout.h"
#include "train/student_group.h"

namespace deepen {

// Buckets follow a ShardLayout (train/shard_layout.h). kAverage: each bucket is all-reduced to the
// students' mean and written back into the parameters' .grad (replicated data parallelism).
// kReduceScatter: each bucket is reduce-scattered into this rank's gradient shard and the
// parameters' .grad dropped (sharded, train/sharded_adamw.h).
//
// Overlap: arm() before the last micro-batch's backward installs nothing new but lets each
// parameter's post-accumulate hook count it done; a bucket whose parameters are all done is
// launched, in a fixed order (last bucket first, as the backward pass finishes the last layers
// first) so every student posts the same collectives in the same order whatever order its hooks
// fire in. finish() launches what is left (in the same order) and waits for everything; without
// arm() it launches every bucket itself, so the result is the same bits either way.
// A parameter that gets no gradient in the step keeps its bucket from launching early; finish()
// sends it as zeros and reports it without a gradient.
class GradientBuckets {
 public:
  enum class Mode { kAverage, kReduceScatter };
  GradientBuckets(StudentGroup& group, Mode mode);

  // The parameters (in the layout's order) and their layout; installs their hooks (replacing any
  // earlier ones: hooks of a previous set are inert from here on).
  void set_parameters(std::vector<at::Tensor> params, ShardLayout layout);
  // kReduceScatter: the tensor (this rank's shard, layout.shard_numel() elements) the buckets
  // reduce into.
  void set_shard(at::Tensor shard) { shard_ = std::move(shard); }

  // Before the backward pass that completes the step's gradients (the last micro-batch).
  void arm();
  // Launches what is left, waits for all; returns, per parameter, whether it had a gradient.
  std::vector<bool> finish();

  int64_t launched_during_backward() const;  // buckets the hooks launched in the last step

 private:
  struct State;
  void launch(int64_t bucket);
  StudentGroup& group_;
  Mode mode_;
  std::vector<at::Tensor> params_;
  ShardLayout layout_;
  at::Tensor shard_;
  std::shared_ptr<State> state_;
};

}  // namespace deepen
