// Sharded AdamW: reduce-scatter of gradient buckets, updates of owned slices, all-gather of parameters.
#include "train/sharded_adamw.h"

#include <cmath>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>

#include "train/student_group.h"

namespace deepen {

namespace {

at::Tensor flat(const at::Tensor& t) { return t.view({-1}); }

}  // namespace

ShardedAdamW::ShardedAdamW(AdamWOptions options, StudentGroup& group, int64_t bucket_bytes)
    : options_(options), group_(group), bucket_bytes_(bucket_bytes), buckets_(group, GradientBuckets::Mode::kReduceScatter) {
  if (bucket_bytes_ < 1) throw std::invalid_argument("ShardedAdamW: bucket_bytes must be >= 1");
}

void ShardedAdamW::clear() {
  params_.clear();
  layout_ = ShardLayout{};
  owned_.clear();
  exp_avg_ = exp_avg_sq_ = at::Tensor();
  buckets_.set_parameters({}, layout_);
}

void ShardedAdamW::new_grad_shard() {
  grad_shard_ = at::zeros({layout_.shard_numel()}, exp_avg_.options());
  buckets_.set_shard(grad_shard_);
}

void ShardedAdamW::arm_reduction() {
  if (params_.empty()) return;
  new_grad_shard();
  buckets_.arm();
}

std::vector<std::string> ShardedAdamW::names() const {
  std::vector<std::string> out;
  for (const Param& p : params_) out.push_back(p.name);
  return out;
}

int64_t ShardedAdamW::state_bytes() const {
  return exp_avg_.defined() ? static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes()) : 0;
}

std::map<std::string, std::pair<at::Tensor, at::Tensor>> ShardedAdamW::gather_moments() const {
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> out;
  for (const Param& p : params_) out[p.name] = {at::Tensor(), at::Tensor()};
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const int64_t bi = static_cast<int64_t>(b);
    const ShardLayout::Bucket& bucket = layout_.buckets[b];
    for (int which = 0; which < 2; ++which) {
      const at::Tensor& shard = which == 0 ? exp_avg_ : exp_avg_sq_;
      at::Tensor whole = at::empty({bucket.size}, shard.options());
      group_.all_gather(shard.narrow(0, layout_.shard_offset(bi), layout_.chunk(bi)), whole);
      for (int64_t p = bucket.first_param; p < bucket.end_param; ++p) {
        const ShardLayout::Placement& pl = layout_.params[static_cast<size_t>(p)];
        at::Tensor host = whole.narrow(0, pl.offset, pl.numel).to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
        auto& slot = out[params_[static_cast<size_t>(p)].name];
        (which == 0 ? slot.first : slot.second) = host;
      }
    }
  }
  return out;
}

void ShardedAdamW::set_parameters(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  bool same = params.size() == params_.size();
  for (size_t i = 0; same && i < params.size(); ++i)
    same = params[i].first == params_[i].name && params[i].second.numel() == params_[i].tensor.numel();
  if (same) {  // a re-bind (e.g. after a resume loaded new tensors): layout and state stay
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < params.size(); ++i) tensors.push_back(params_[i].tensor = params[i].second);
    buckets_.set_parameters(tensors, layout_);
    return;
  }
  // Moments that survive the change travel through the host; every rank takes the same branch
  // (the parameter lists agree, checked by the trainer's checksums).
  std::set<std::string> kept;
  for (const Param& p : params_) kept.insert(p.name);
  bool any_kept = false;
  for (const auto& [name, t] : params) any_kept = any_kept || kept.count(name) > 0;
  const auto moments = any_kept ? gather_moments() : std::map<std::string, std::pair<at::Tensor, at::Tensor>>{};
  std::map<std::string, int64_t> steps;
  for (const Param& p : params_) steps[p.name] = p.step;

  params_.clear();
  std::vector<int64_t> numels;
  for (const auto& [name, t] : params) {
    if (t.scalar_type() != params.front().second.scalar_type() || t.device() != params.front().second.device())
      throw std::invalid_argument("ShardedAdamW: parameters of one dtype and device expected (" + name + ")");
    if (!t.is_contiguous()) throw std::invalid_argument("ShardedAdamW: parameter " + name + " is not contiguous");
    params_.push_back({name, t, steps.count(name) ? steps[name] : 0});
    numels.push_back(t.numel());
  }
  if (params_.empty()) {
    clear();
    return;
  }
  const at::TensorOptions opts = params_.front().tensor.options().requires_grad(false);
  layout_ = make_shard_layout(numels, group_.size(),
                              bucket_elements(bucket_bytes_, params_.front().tensor.element_size()));
  owned_ = layout_.owned(group_.rank());
  std::vector<at::Tensor> tensors;
  for (const Param& p : params_) tensors.push_back(p.tensor);
  buckets_.set_parameters(tensors, layout_);
  exp_avg_ = at::zeros({layout_.shard_numel()}, opts);
  exp_avg_sq_ = at::zeros({layout_.shard_numel()}, opts);
  for (const ShardLayout::Owned& o : owned_) {
    auto it = moments.find(params_[static_cast<size_t>(o.param)].name);
    if (it == moments.end()) continue;
    exp_avg_.narrow(0, o.shard_offset, o.numel).copy_(it->second.first.narrow(0, o.param_offset, o.numel));
    exp_avg_sq_.narrow(0, o.shard_offset, o.numel).copy_(it->second.second.narrow(0, o.param_offset, o.numel));
  }
}

double ShardedAdamW::reduce_gradients() {
  at::NoGradGuard no_grad;
  if (params_.empty()) return 0;
  if (!grad_shard_.defined()) new_grad_shard();  // not armed: every bucket goes now
  has_grad_ = buckets_.finish();
  // The norm of the mean gradient: each rank's owned slices (padding is zero), summed in fp64.
  const double local_sq = grad_shard_.to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(group_.sum({local_sq})[0]);
}

void ShardedAdamW::update(double lr, double max_norm, double norm) {
  at::NoGradGuard no_grad;
  if (params_.empty()) return;
  if (!grad_shard_.defined()) throw std::logic_error("ShardedAdamW::update before reduce_gradients");
  if (max_norm > 0 && norm > max_norm) grad_shard_.mul_(max_norm / (norm + 1e-6));
  // Step counts advance on every rank for every parameter that had a gradient, owned or not.
  for (size_t p = 0; p < params_.size(); ++p)
    if (has_grad_[p]) params_[p].step += 1;
  param_shard_ = at::zeros({layout_.shard_numel()}, exp_avg_.options());
  for (const ShardLayout::Owned& o : owned_) {
    const Param& param = params_[static_cast<size_t>(o.param)];
    at::Tensor slice = param_shard_.narrow(0, o.shard_offset, o.numel);
    slice.copy_(flat(param.tensor).narrow(0, o.param_offset, o.numel));
    if (!has_grad_[static_cast<size_t>(o.param)]) continue;
    adamw_update(slice, grad_shard_.narrow(0, o.shard_offset, o.numel), exp_avg_.narrow(0, o.shard_offset, o.numel),
                 exp_avg_sq_.narrow(0, o.shard_offset, o.numel), param.step, lr, param.tensor.dim() >= 2, options_);
  }
  grad_shard_ = at::Tensor();
}

void ShardedAdamW::gather_parameters() {
  at::NoGradGuard no_grad;
  if (params_.empty()) return;
  if (!param_shard_.defined()) throw std::logic_error("ShardedAdamW::gather_parameters before update");
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const int64_t bi = static_cast<int64_t>(b);
    const ShardLayout::Bucket& bucket = layout_.buckets[b];
    at::Tensor whole = at::empty({bucket.size}, param_shard_.options());
    group_.all_gather(param_shard_.narrow(0, layout_.shard_offset(bi), layout_.chunk(bi)), whole);
    for (int64_t p = bucket.first_param; p < bucket.end_param; ++p) {
      const ShardLayout::Placement& pl = layout_.params[static_cast<size_t>(p)];
      flat(params_[static_cast<size_t>(p)].tensor).copy_(whole.narrow(0, pl.offset, pl.numel));
    }
  }
  param_shard_ = at::Tensor();
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdamW::shard_state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const ShardLayout::Owned& o : owned_) {
    const std::string& name = params_[static_cast<size_t>(o.param)].name;
    out.emplace_back(name + ".exp_avg", exp_avg_.narrow(0, o.shard_offset, o.numel));
    out.emplace_back(name + ".exp_avg_sq", exp_avg_sq_.narrow(0, o.shard_offset, o.numel));
    out.emplace_back(name + ".offset", at::full({1}, o.param_offset, at::kLong));
  }
  for (const Param& p : params_) out.emplace_back(p.name + ".step", at::full({1}, p.step, at::kLong));
  return out;
}

namespace {

const at::Tensor& entry(const std::map<std::string, at::Tensor>& tensors, const std::string& key) {
  auto it = tensors.find(key);
  if (it == tensors.end()) throw std::runtime_error("optimizer state: missing " + key);
  return it->second;
}

}  // namespace

bool ShardedAdamW::load_shard_state(const std::map<std::string, at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  size_t slices = 0;
  for (const auto& [key, t] : tensors) slices += key.ends_with(".offset");
  if (slices != owned_.size()) return false;
  for (const ShardLayout::Owned& o : owned_) {
    const std::string& name = params_[static_cast<size_t>(o.param)].name;
    auto off = tensors.find(name + ".offset"), avg = tensors.find(name + ".exp_avg");
    if (off == tensors.end() || avg == tensors.end() || off->second.item<int64_t>() != o.param_offset ||
        avg->second.numel() != o.numel)
      return false;
  }
  for (Param& p : params_) p.step = entry(tensors, p.name + ".step").item<int64_t>();
  for (const ShardLayout::Owned& o : owned_) {
    const std::string& name = params_[static_cast<size_t>(o.param)].name;
    exp_avg_.narrow(0, o.shard_offset, o.numel).copy_(entry(tensors, name + ".exp_avg").reshape({-1}));
    exp_avg_sq_.narrow(0, o.shard_offset, o.numel).copy_(entry(tensors, name + ".exp_avg_sq").reshape({-1}));
  }
  return true;
}

void ShardedAdamW::load_full_state(const std::map<std::string, at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (Param& p : params_) {
    p.step = entry(tensors, p.name + ".step").item<int64_t>();
    for (const char* m : {".exp_avg", ".exp_avg_sq"})
      if (entry(tensors, p.name + m).numel() != p.tensor.numel())
        throw std::runtime_error("optimizer state: " + p.name + m + " has " +
                                 std::to_string(entry(tensors, p.name + m).numel()) + " elements, the parameter " +
                                 std::to_string(p.tensor.numel()));
  }
  for (const ShardLayout::Owned& o : owned_) {
    const std::string& name = params_[static_cast<size_t>(o.param)].name;
    exp_avg_.narrow(0, o.shard_offset, o.numel)
        .copy_(entry(tensors, name + ".exp_avg").reshape({-1}).narrow(0, o.param_offset, o.numel));
    exp_avg_sq_.narrow(0, o.shard_offset, o.numel)
        .copy_(entry(tensors, name + ".exp_avg_sq").reshape({-1}).narrow(0, o.param_offset, o.numel));
  }
}

}  // namespace deepen
