// ShardedAdamW: AdamW with its moments sharded over the student ranks (parallel.sharding = "grad_op":
// gradients reduce-scattered, each rank updates the slices it owns, parameters all-gathered; "full":
// decoder blocks' parameters sharded too, gathered block by block around their use).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/block_gate.h"
#include "train/adamw.h"
#include "train/gradient_buckets.h"
#include "train/shard_layout.h"

namespace deepen {

class StudentGroup;

// The same update as AdamW (adamw_update on each owned slice, a parameter's own step count, decay
// on matrices only) and the same gradient clipping as the replicated trainer, so a sharded run
// follows the replicated one up to the order of the gradient sums. Per rank it holds 1/S of the
// moments (plus at most one padding element per bucket), one bucket of temporaries, and a gradient
// shard.
//
// Modes:
//   kGradOp (FSDP's SHARD_GRAD_OP, ZeRO stage 2): parameters stay whole on every rank.
//   kFull (FSDP's FULL_SHARD, ZeRO stage 3, for the decoder blocks): a parameter given a unit >= 0
//     (its block) lives between uses only as this rank's slice of the fp32 master values; the
//     tensor the model holds is emptied (0 elements: a use outside a gather fails loudly instead
//     of reading stale values). As the BlockGate of the student it all-gathers a block's buckets
//     into the block's tensors before the block computes and empties them after (the student
//     calls it; with layer recomputation the backward gathers the block again). Parameters of unit
//     -1 (embedding, boundary norm, head) stay whole and are all-gathered after each update, as in
//     kGradOp. Each micro-batch's gradients are reduce-scattered after its backward
//     (accumulate_reduction), so no whole gradient outlives its bucket.
// Every public call except the state readers is collective over the students' group.
class ShardedAdamW : public BlockGate {
 public:
  enum class Mode { kGradOp, kFull };
  // bucket_bytes: size of the flat buckets the gradients are reduce-scattered in (parallel.bucket_cap_mb).
  ShardedAdamW(AdamWOptions options, StudentGroup& group, int64_t bucket_bytes, Mode mode = Mode::kGradOp);

  // kFull: every sharded block gathered for the scope's lifetime (collective to open, at the same
  // point on every student; scopes nest). Inside it the model is whole, for whatever reads or
  // replaces parameters (checksums, checkpoints, evaluation, diagnostics, growth); values changed
  // in the scope are kept only through set_parameters. kGradOp or nullptr: nothing happens.
  class WholeScope {
   public:
    explicit WholeScope(ShardedAdamW* owner);
    ~WholeScope();
    WholeScope(const WholeScope&) = delete;
    WholeScope& operator=(const WholeScope&) = delete;

   private:
    ShardedAdamW* owner_;
  };

  // The trainable parameters, in the trainer's order (the same on every rank), after a start,
  // growth, freeze or resume. A parameter keeps its moments and step count by name; a new name
  // starts fresh; a name not listed drops its state. When the set changes the layout changes, and
  // the moments that stay are re-sharded (all-gathered to the host, then sliced anew).
  // units (kFull): per parameter its block, or -1 for one that stays whole; empty: all -1. In
  // kFull the parameters must be whole (a fresh model, or inside a WholeScope): their values
  // become the master slices, and the blocks are emptied unless a WholeScope is open.
  void set_parameters(const std::vector<std::pair<std::string, at::Tensor>>& params,
                      const std::vector<int64_t>& units = {});
  // Drops every parameter's state (a phase reset): the next set_parameters starts all fresh.
  void clear();

  // One optimizer step, in three calls so a trainer can time communication and compute apart:
  //   reduce_gradients: the students' mean gradient, reduce-scattered bucket by bucket (each
  //     parameter's .grad is dropped once its bucket is sent); returns its global L2 norm.
  //   update: clips the mean gradient to max_norm (0: off) as the replicated trainer clips, then
  //     AdamW at `lr` on this rank's slices (local).
  //   gather_parameters: the updated slices all-gathered into every rank's whole parameters.
  //   arm_reduction (optional, before a backward pass): its buckets are reduce-scattered from
  //     inside that backward as they fill (train/gradient_buckets.h).
  //   accumulate_reduction (optional, after a backward pass): its gradients reduce-scattered now
  //     (what arm_reduction did not launch) and added to the step's gradient shard. kFull calls
  //     it after every micro-batch; without it reduce_gradients reduces the accumulated .grad.
  void arm_reduction();
  void accumulate_reduction();
  double reduce_gradients();
  void update(double lr, double max_norm, double norm);
  void gather_parameters();
  //   discard_gradients: instead of update and gather_parameters, drops the reduced gradient: no
  //     parameter, moment or step count changes (a step the divergence guard skips or stops on).
  void discard_gradients();

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

  // BlockGate (kFull; nothing in kGradOp): block `unit`'s parameters gathered / emptied.
  void gather(int64_t unit) override;
  void release(int64_t unit) override;

  std::vector<std::string> names() const;
  Mode mode() const { return mode_; }
  // Bytes of moments this rank holds (both moments, padding included).
  int64_t state_bytes() const;
  // Bytes of the parameters' values this rank holds now: kFull's master slices plus every whole
  // tensor (the ends, and blocks while gathered); kGradOp every parameter whole.
  int64_t parameter_bytes() const;
  const ShardLayout& layout() const { return layout_; }

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    std::vector<int64_t> shape;  // the whole shape (kFull empties the tensor between uses)
    int64_t step = 0;
    int64_t unit = -1;
  };
  // A zero gradient shard for the coming reduction, handed to the buckets.
  void new_partial_shard();
  bool sharded(size_t param) const { return mode_ == Mode::kFull && params_[param].unit >= 0; }
  // Bucket b all-gathered from `values` (this rank's shard of some per-element state); its
  // parameters' whole values are then views of the returned buffer.
  at::Tensor gather_bucket(const at::Tensor& values, int64_t bucket) const;
  void gather_all();   // every sharded unit (WholeScope)
  void release_all();  // every sharded unit not pinned by a WholeScope
  // The whole moments of every parameter, on the host, from every rank's shards (collective).
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> gather_moments() const;

  AdamWOptions options_;
  StudentGroup& group_;
  Mode mode_;
  // Between the backward and update: this rank's slice of the mean gradient (partial_: the
  // reduction in flight), and which parameters had a gradient (a parameter without one is
  // skipped, as AdamW skips it).
  at::Tensor grad_shard_, partial_;
  // This rank's slices of the parameter values: kFull always (the master copy), kGradOp between
  // update and gather_parameters.
  at::Tensor param_shard_;
  // kFull: per unit its buckets [first, end), and whether its tensors are whole now.
  std::map<int64_t, std::pair<int64_t, int64_t>> unit_buckets_;
  std::map<int64_t, bool> gathered_;
  int pinned_ = 0;  // open WholeScopes
  GradientBuckets buckets_;
  std::vector<bool> has_grad_;
  int64_t bucket_bytes_;
  std::vector<Param> params_;
  ShardLayout layout_;
  std::vector<ShardLayout::Owned> owned_;
  at::Tensor exp_avg_, exp_avg_sq_;  // this rank's shard, the parameters' dtype and device
};

}  // namespace deepen
