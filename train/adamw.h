// AdamW keyed by parameter name, so growth adds fresh state and checkpoints store it by name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepen {

struct AdamWOptions {
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
};

// One AdamW update in place of `param` and its moments, with the parameter's own step count
// (already incremented) and whether it decays: the arithmetic both optimizers share, on whole
// parameters (AdamW) or on a rank's slices of them (ShardedAdamW, train/sharded_adamw.h).
void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, int64_t step, double lr, bool decay, const AdamWOptions& options);

// Sum of the squares of every element of `pieces`, in fp64: each piece's sum stays on its device
// and all come to the host in one copy (one device synchronization), added there in order. The
// gradient norm both trainers clip by (replicated: whole gradients; sharded: a rank's bucket chunks,
// so no fp64 copy of a whole shard is made).
double sum_of_squares(const std::vector<at::Tensor>& pieces);

// The update is torch.optim.AdamW's (decoupled decay, bias-corrected moments). Decay applies to
// matrices only: norms' gains and 1-D parameters are not pulled toward zero, as in most LLM recipes.
// Parameters are registered by name; a parameter registered later (a grown block) starts with
// fresh moments and its own step count, while existing parameters keep theirs across growth.
class AdamW {
 public:
  explicit AdamW(AdamWOptions options) : options_(options) {}

  // Registers (or re-binds after a resume) a parameter. Frozen parameters may stay registered:
  // a parameter without a gradient is skipped, its state untouched.
  void add(const std::string& name, const at::Tensor& param);

  // Drops the state of every parameter not in `names` (a parameter that stopped training: the
  // freeze control's prefix holds no optimizer state).
  void keep_only(const std::vector<std::string>& names);
  // Drops every parameter's state: the next add() starts fresh moments and step counts (a phase
  // reset under curriculum.phase_policy = "reset").
  void clear() { params_.clear(); }

  void step(double lr);
  void zero_grad();

  // Moments and step counts as named tensors ("<name>.exp_avg", "<name>.exp_avg_sq",
  // "<name>.step" as a 1-element int64), for checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Restores from state_tensors() output; throws std::runtime_error naming a missing entry.
  void load_state(const std::map<std::string, at::Tensor>& tensors);

  size_t size() const { return params_.size(); }
  // Registered names, sorted (what state_tensors() covers).
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return params_.count(name) > 0; }

 private:
  struct Slot {
    at::Tensor param;
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
    int64_t step = 0;
  };
  AdamWOptions options_;
  std::map<std::string, Slot> params_;
};

}  // namespace deepen
