// ShardedAdamW: AdamW with its moments sharded over the student ranks (parallel.sharding =
// "grad_op": gradients reduce-scattered, each rank updates the slices it owns, parameters all-gathered).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/adamw.h"
#include "train/gradient_buckets.h"
#include "train/shard_layout.h"

namespace deepen {

class StudentGroup;

// The same update as AdamW (adamw_update on each owned slice, a parameter's own step count, decay
// on matrices only) and the same gradient clipping as the replicated trainer, so a sharded run
// follows the replicated one up to the order of the gradient sums. Per rank it holds 1/S of the
// moments (plus at most one padding element per bucket), one bucket of temporaries, and a gradient
// shard; parameters stay whole on every rank (FSDP's SHARD_GRAD_OP, ZeRO stage 2).
// Every public call except the state readers is collective over the students' group.
class ShardedAdamW {
 public:
  // bucket_bytes: size of the flat buckets the gradients are reduce-scattered in (parallel.bucket_cap_mb).
  ShardedAdamW(AdamWOptions options, StudentGroup& group, int64_t bucket_bytes);

  // The trainable parameters, in the trainer's order (the same on every rank), after a start,
  // growth, freeze or resume. A parameter keeps its moments and step count by name; a new name
  // starts fresh; a name not listed drops its state. When the set changes the layout changes, and
  // the moments that stay are re-sharded (all-gathered to the host, then sliced anew).
  void set_parameters(const std::vector<std::pair<std::string, at::Tensor>>& params);
  // Drops every parameter's state (a phase reset): the next set_parameters starts all fresh.
  void clear();

  // One optimizer step, in three calls so a trainer can time communication and compute apart:
  //   reduce_gradients: the students' mean gradient, reduce-scattered bucket by bucket (each
  //     parameter's .grad is dropped once its bucket is sent); returns its global L2 norm.
  //   update: clips the mean gradient to max_norm (0: off) as the replicated trainer clips, then
  //     AdamW at `lr` on this rank's slices (local).
  //   gather_parameters: the updated slices all-gathered into every rank's whole parameters.
  //   arm_reduction (optional, before the backward pass that completes the gradients): buckets
  //     are reduce-scattered from inside that backward as they fill (train/gradient_buckets.h).
  void arm_reduction();
  double reduce_gradients();
  void update(double lr, double max_norm, double norm);
  void gather_parameters();

  // Checkpoints, one file per rank: this rank's slices as "<name>.exp_avg" / "<name>.exp_avg_sq"
  // (1-D) with "<name>.offset" (the slice's first element, int64[1]), and every parameter's
  // "<name>.step" (int64[1], the same on every rank).
  std::vector<std::pair<std::string, at::Tensor>> shard_state() const;
  // Restores from this rank's own shard file when it holds exactly this layout's slices (same
  // students, parameters and bucket size); false when it does not: pass the whole state instead.
  bool load_shard_state(const std::map<std::string, at::Tensor>& tensors);
  // Restores from whole-parameter state (AdamW::state_tensors' names), taking this rank's slices.
  // Throws std::runtime_error naming a missing or mis-sized entry.
  void load_full_state(const std::map<std::string, at::Tensor>& tensors);

  std::vector<std::string> names() const;
  // Bytes of moments this rank holds (both moments, padding included).
  int64_t state_bytes() const;
  const ShardLayout& layout() const { return layout_; }

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    int64_t step = 0;
  };
  // A zero gradient shard for the coming reduction, handed to the buckets.
  void new_grad_shard();
  // The whole moments of every parameter, on the host, from every rank's shards (collective).
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> gather_moments() const;

  AdamWOptions options_;
  StudentGroup& group_;
  // Between reduce_gradients and update: this rank's slice of the mean gradient, and which
  // parameters had a gradient (a parameter without one is skipped, as AdamW skips it).
  at::Tensor grad_shard_, param_shard_;
  GradientBuckets buckets_;
  std::vector<bool> has_grad_;
  int64_t bucket_bytes_;
  std::vector<Param> params_;
  ShardLayout layout_;
  std::vector<ShardLayout::Owned> owned_;
  at::Tensor exp_avg_, exp_avg_sq_;  // this rank's shard, the parameters' dtype and device
};

}  // namespace deepen
