// Gradient buckets launched from post-accumulate-grad hooks while the backward pass runs.
#include "train/gradient_buckets.h"

#include <functional>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace deepen {

// What the hooks and the owner share. A new set of parameters gets a new State; hooks of an old
// set keep theirs, which is never armed again.
struct GradientBuckets::State {
  GradientBuckets* owner = nullptr;
  bool armed = false;
  std::vector<int64_t> param_bucket;   // bucket of each parameter
  std::vector<int64_t> waiting;        // per bucket: parameters not yet done
  std::vector<bool> done;              // per parameter: hook fired this step
  std::vector<bool> has_grad;          // per parameter: had a gradient when its bucket launched
  std::vector<at::Tensor> flat;        // per bucket: the launched flat buffer
  std::vector<std::unique_ptr<StudentGroup::Pending>> pending;  // per bucket
  int64_t next = -1;                   // next bucket to launch (counting down)
  int64_t launched_in_backward = 0;
};

namespace {

class ReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit ReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable&) override { ready_(); }

 private:
  std::function<void()> ready_;
};

}  // namespace

GradientBuckets::GradientBuckets(StudentGroup& group, Mode mode) : group_(group), mode_(mode) {}

void GradientBuckets::set_parameters(std::vector<at::Tensor> params, ShardLayout layout) {
  if (static_cast<int64_t>(params.size()) != static_cast<int64_t>(layout.params.size()))
    throw std::invalid_argument("GradientBuckets: parameters and layout differ in count");
  if (state_) state_->owner = nullptr;  // the old hooks go inert
  params_ = std::move(params);
  layout_ = std::move(layout);
  state_ = std::make_shared<State>();
  state_->owner = this;
  for (const auto& p : layout_.params) state_->param_bucket.push_back(p.bucket);
  // Hooks only where posting inside the backward is possible (not through host staging).
  if (params_.empty() || !group_.overlaps_on(params_.front().device())) return;
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t index = static_cast<int64_t>(i);
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i], std::make_unique<ReadyHook>([weak, index] {
          auto s = weak.lock();
          if (!s || !s->armed || !s->owner || s->done[static_cast<size_t>(index)]) return;
          s->done[static_cast<size_t>(index)] = true;
          const int64_t b = s->param_bucket[static_cast<size_t>(index)];
          --s->waiting[static_cast<size_t>(b)];
          while (s->next >= 0 && s->waiting[static_cast<size_t>(s->next)] == 0) {
            s->owner->launch(s->next);
            ++s->launched_in_backward;
            --s->next;
          }
          // MPI moves a posted collective only inside MPI calls: poll what is in flight. A finished
          // reduce-scatter is let go at once: its request holds the bucket's flat copy, and under
          // full sharding the buckets of a whole backward would otherwise all live until finish().
          for (auto& p : s->pending)
            if (p && p->test() && s->owner->mode_ == Mode::kReduceScatter) p.reset();
        }));
  }
}

void GradientBuckets::arm() {
  State& s = *state_;
  s.armed = true;
  s.done.assign(params_.size(), false);
  s.has_grad.assign(params_.size(), false);
  s.waiting.clear();
  for (const auto& b : layout_.buckets) s.waiting.push_back(b.end_param - b.first_param);
  s.flat.assign(layout_.buckets.size(), at::Tensor());
  s.pending.clear();
  s.pending.resize(layout_.buckets.size());
  s.next = static_cast<int64_t>(layout_.buckets.size()) - 1;
  s.launched_in_backward = 0;
}

void GradientBuckets::launch(int64_t bucket) {
  at::NoGradGuard no_grad;
  State& s = *state_;
  const ShardLayout::Bucket& b = layout_.buckets[static_cast<size_t>(bucket)];
  at::Tensor flat;
  for (int64_t p = b.first_param; p < b.end_param; ++p) {
    const at::Tensor& param = params_[static_cast<size_t>(p)];
    if (!flat.defined()) flat = at::zeros({b.size}, param.options().requires_grad(false));
    const at::Tensor grad = param.grad();
    if (!grad.defined()) continue;
    const ShardLayout::Placement& pl = layout_.params[static_cast<size_t>(p)];
    flat.narrow(0, pl.offset, pl.numel).copy_(grad.reshape({-1}));
    s.has_grad[static_cast<size_t>(p)] = true;
  }
  if (mode_ == Mode::kAverage) {
    s.flat[static_cast<size_t>(bucket)] = flat;  // read back by finish()
    s.pending[static_cast<size_t>(bucket)] = group_.start_average(flat);
    return;
  }
  const at::Tensor out = shard_.narrow(0, layout_.shard_offset(bucket), layout_.chunk(bucket));
  s.pending[static_cast<size_t>(bucket)] = group_.start_reduce_scatter_avg(flat, out);
  // The bucket holds the gradients now; a later micro-batch would re-create them, but this is the
  // last: dropping them frees the memory during the backward (the hook runs after accumulation).
  for (int64_t p = b.first_param; p < b.end_param; ++p) params_[static_cast<size_t>(p)].mutable_grad() = at::Tensor();
}

std::vector<bool> GradientBuckets::finish() {
  if (!state_->armed) arm();  // not overlapped: every bucket is launched here
  State& s = *state_;
  s.armed = false;
  if (mode_ == Mode::kReduceScatter && (!shard_.defined() || shard_.numel() != layout_.shard_numel()))
    throw std::logic_error("GradientBuckets: reduce-scatter without a shard of the layout's size");
  for (; s.next >= 0; --s.next) launch(s.next);
  for (int64_t b = static_cast<int64_t>(layout_.buckets.size()) - 1; b >= 0; --b) {
    if (s.pending[static_cast<size_t>(b)]) s.pending[static_cast<size_t>(b)]->wait();
    if (mode_ != Mode::kAverage) continue;
    const ShardLayout::Bucket& bucket = layout_.buckets[static_cast<size_t>(b)];
    for (int64_t p = bucket.first_param; p < bucket.end_param; ++p) {
      if (!s.has_grad[static_cast<size_t>(p)]) continue;
      const ShardLayout::Placement& pl = layout_.params[static_cast<size_t>(p)];
      at::Tensor grad = params_[static_cast<size_t>(p)].mutable_grad();
      grad.copy_(s.flat[static_cast<size_t>(b)].narrow(0, pl.offset, pl.numel).view(grad.sizes()));
    }
  }
  s.pending.clear();
  s.flat.clear();
  return s.has_grad;
}

int64_t GradientBuckets::launched_during_backward() const { return state_ ? state_->launched_in_backward : 0; }

}  // namespace deepen
