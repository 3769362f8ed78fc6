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

ShardedAdamW::ShardedAdamW(AdamWOptions options, StudentGroup& group, int64_t bucket_bytes, Mode mode)
    : options_(options),
      group_(group),
      mode_(mode),
      buckets_(group, GradientBuckets::Mode::kReduceScatter),
      bucket_bytes_(bucket_bytes) {
  if (bucket_bytes_ < 1) throw std::invalid_argument("ShardedAdamW: bucket_bytes must be >= 1");
}

ShardedAdamW::WholeScope::WholeScope(ShardedAdamW* owner) : owner_(owner) {
  if (owner_ && ++owner_->pinned_ == 1) owner_->gather_all();
}

ShardedAdamW::WholeScope::~WholeScope() {
  if (owner_ && --owner_->pinned_ == 0) owner_->release_all();
}

void ShardedAdamW::clear() {
  // The blocks' values live only in the master slices between uses.
  if (mode_ == Mode::kFull && !unit_buckets_.empty() && pinned_ == 0)
    throw std::logic_error("ShardedAdamW::clear with sharded blocks needs a WholeScope");
  params_.clear();
  layout_ = ShardLayout{};
  owned_.clear();
  unit_buckets_.clear();
  gathered_.clear();
  exp_avg_ = exp_avg_sq_ = param_shard_ = grad_shard_ = partial_ = at::Tensor();
  buckets_.set_parameters({}, layout_);
}

void ShardedAdamW::new_partial_shard() {
  partial_ = at::zeros({layout_.shard_numel()}, exp_avg_.options());
  buckets_.set_shard(partial_);
}

void ShardedAdamW::arm_reduction() {
  if (params_.empty()) return;
  new_partial_shard();
  buckets_.arm();
}

void ShardedAdamW::accumulate_reduction() {
  at::NoGradGuard no_grad;
  if (params_.empty()) return;
  if (!partial_.defined()) new_partial_shard();  // not armed: every bucket goes now
  const std::vector<bool> had = buckets_.finish();
  buckets_.set_shard(at::Tensor());  // else the buckets would keep the last shard alive between steps
  if (!grad_shard_.defined()) {
    grad_shard_ = partial_;
    has_grad_ = had;
  } else {
    grad_shard_.add_(partial_);
    for (size_t p = 0; p < had.size(); ++p) has_grad_[p] = has_grad_[p] || had[p];
  }
  partial_ = at::Tensor();
}

std::vector<std::string> ShardedAdamW::names() const {
  std::vector<std::string> out;
  for (const Param& p : params_) out.push_back(p.name);
  return out;
}

int64_t ShardedAdamW::state_bytes() const {
  return exp_avg_.defined() ? static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes()) : 0;
}

int64_t ShardedAdamW::parameter_bytes() const {
  int64_t total = mode_ == Mode::kFull && param_shard_.defined() ? static_cast<int64_t>(param_shard_.nbytes()) : 0;
  for (const Param& p : params_) total += static_cast<int64_t>(p.tensor.nbytes());
  return total;
}

at::Tensor ShardedAdamW::gather_bucket(const at::Tensor& values, int64_t bucket) const {
  at::Tensor whole = at::empty({layout_.buckets[static_cast<size_t>(bucket)].size}, values.options());
  group_.all_gather(values.narrow(0, layout_.shard_offset(bucket), layout_.chunk(bucket)), whole);
  return whole;
}

void ShardedAdamW::gather(int64_t unit) {
  if (mode_ != Mode::kFull || pinned_ > 0) return;
  auto it = unit_buckets_.find(unit);
  if (it == unit_buckets_.end() || gathered_[unit]) return;
  at::NoGradGuard no_grad;
  for (int64_t b = it->second.first; b < it->second.second; ++b) {
    const at::Tensor whole = gather_bucket(param_shard_, b);
    const ShardLayout::Bucket& bucket = layout_.buckets[static_cast<size_t>(b)];
    for (int64_t p = bucket.first_param; p < bucket.end_param; ++p) {
      const ShardLayout::Placement& pl = layout_.params[static_cast<size_t>(p)];
      Param& param = params_[static_cast<size_t>(p)];
      // set_data keeps the tensor (the module's, the optimizer's, its hooks and grad accumulator)
      // and swaps what it holds, as FSDP does: views of the bucket, freed with its last view.
      param.tensor.set_data(whole.narrow(0, pl.offset, pl.numel).view(param.shape));
    }
  }
  gathered_[unit] = true;
}

void ShardedAdamW::release(int64_t unit) {
  if (mode_ != Mode::kFull || pinned_ > 0) return;
  auto it = gathered_.find(unit);
  if (it == gathered_.end() || !it->second) return;
  // The unit's parameters are exactly those of its buckets (a bucket never holds two units).
  const auto [first, end] = unit_buckets_.at(unit);
  for (int64_t p = layout_.buckets[static_cast<size_t>(first)].first_param;
       p < layout_.buckets[static_cast<size_t>(end - 1)].end_param; ++p) {
    at::Tensor& t = params_[static_cast<size_t>(p)].tensor;
    t.set_data(at::empty({0}, t.options()));
  }
  it->second = false;
}

void ShardedAdamW::gather_all() {
  if (mode_ != Mode::kFull) return;
  const int saved = pinned_;
  pinned_ = 0;  // gather() does nothing while pinned
  for (const auto& [unit, range] : unit_buckets_) gather(unit);
  pinned_ = saved;
}

void ShardedAdamW::release_all() {
  if (mode_ != Mode::kFull || pinned_ > 0) return;
  for (const auto& [unit, range] : unit_buckets_) release(unit);
}

std::map<std::string, std::pair<at::Tensor, at::Tensor>> ShardedAdamW::gather_moments() const {
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> out;
  for (const Param& p : params_) out[p.name] = {at::Tensor(), at::Tensor()};
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const ShardLayout::Bucket& bucket = layout_.buckets[b];
    for (int which = 0; which < 2; ++which) {
      const at::Tensor whole = gather_bucket(which == 0 ? exp_avg_ : exp_avg_sq_, static_cast<int64_t>(b));
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

void ShardedAdamW::set_parameters(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                  const std::vector<int64_t>& units) {
  at::NoGradGuard no_grad;
  if (!units.empty() && units.size() != params.size())
    throw std::invalid_argument("ShardedAdamW: one unit per parameter expected");
  auto unit_of = [&](size_t i) { return mode_ == Mode::kFull && !units.empty() ? units[i] : int64_t{-1}; };
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    if (t.scalar_type() != params.front().second.scalar_type() || t.device() != params.front().second.device())
      throw std::invalid_argument("ShardedAdamW: parameters of one dtype and device expected (" + name + ")");
    if (!t.is_contiguous()) throw std::invalid_argument("ShardedAdamW: parameter " + name + " is not contiguous");
  }
  // kFull reads every value from the tensors: a block emptied between uses (given outside a
  // WholeScope) would lose its values.
  if (mode_ == Mode::kFull)
    for (const Param& p : params_)
      if (p.unit >= 0 && !gathered_[p.unit])
        throw std::logic_error("ShardedAdamW: parameter " + p.name + " is sharded: set_parameters needs a WholeScope");
  bool same = params.size() == params_.size();
  for (size_t i = 0; same && i < params.size(); ++i)
    same = params[i].first == params_[i].name && params[i].second.sizes().vec() == params_[i].shape &&
           unit_of(i) == params_[i].unit;
  if (same) {  // a re-bind (e.g. after a resume loaded new tensors): layout and state stay
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < params.size(); ++i) tensors.push_back(params_[i].tensor = params[i].second);
    buckets_.set_parameters(tensors, layout_);
  } else {
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
    std::vector<int64_t> numels, layout_units;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [name, t] = params[i];
      params_.push_back({name, t, t.sizes().vec(), steps.count(name) ? steps[name] : 0, unit_of(i)});
      numels.push_back(t.numel());
      layout_units.push_back(unit_of(i));
    }
    if (params_.empty()) {
      clear();
      return;
    }
    const at::TensorOptions opts = params_.front().tensor.options().requires_grad(false);
    // kGradOp keeps the layout of one unit (buckets as before units existed: its checkpoints' slices).
    layout_ = make_shard_layout(numels, group_.size(),
                                bucket_elements(bucket_bytes_, params_.front().tensor.element_size()),
                                mode_ == Mode::kFull ? layout_units : std::vector<int64_t>{});
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
  if (mode_ != Mode::kFull) return;
  // The master slices from the whole values every rank holds now; then the blocks are emptied.
  unit_buckets_.clear();
  gathered_.clear();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const int64_t unit = layout_.units[static_cast<size_t>(layout_.buckets[b].first_param)];
    if (unit < 0) continue;
    auto [it, fresh] = unit_buckets_.try_emplace(unit, static_cast<int64_t>(b), static_cast<int64_t>(b) + 1);
    if (!fresh) it->second.second = static_cast<int64_t>(b) + 1;
    gathered_[unit] = true;
  }
  param_shard_ = at::zeros({layout_.shard_numel()}, exp_avg_.options());
  for (const ShardLayout::Owned& o : owned_) {
    const Param& param = params_[static_cast<size_t>(o.param)];
    param_shard_.narrow(0, o.shard_offset, o.numel).copy_(flat(param.tensor).narrow(0, o.param_offset, o.numel));
  }
  release_all();
}

double ShardedAdamW::reduce_gradients() {
  at::NoGradGuard no_grad;
  if (params_.empty()) return 0;
  // What the backward left: an armed reduction in flight, or (nothing reduced yet) the .grads.
  if (partial_.defined() || !grad_shard_.defined()) accumulate_reduction();
  // The norm of the mean gradient: each rank's owned slices (padding is zero), summed in fp64,
  // bucket chunk by chunk: the fp64 copy of a whole shard would be twice the shard (N/S · 8 bytes,
  // and its square as much again) at the step's peak.
  std::vector<at::Tensor> chunks;
  for (int64_t b = 0, offset = 0; b < static_cast<int64_t>(layout_.buckets.size()); offset += layout_.chunk(b++))
    chunks.push_back(grad_shard_.narrow(0, offset, layout_.chunk(b)));
  return std::sqrt(group_.sum({sum_of_squares(chunks)})[0]);
}

void ShardedAdamW::update(double lr, double max_norm, double norm) {
  at::NoGradGuard no_grad;
  if (params_.empty()) return;
  if (!grad_shard_.defined()) throw std::logic_error("ShardedAdamW::update before reduce_gradients");
  if (max_norm > 0 && norm > max_norm) grad_shard_.mul_(max_norm / (norm + 1e-6));
  // Step counts advance on every rank for every parameter that had a gradient, owned or not.
  for (size_t p = 0; p < params_.size(); ++p)
    if (has_grad_[p]) params_[p].step += 1;
  if (mode_ == Mode::kGradOp) param_shard_ = at::zeros({layout_.shard_numel()}, exp_avg_.options());
  for (const ShardLayout::Owned& o : owned_) {
    const Param& param = params_[static_cast<size_t>(o.param)];
    at::Tensor slice = param_shard_.narrow(0, o.shard_offset, o.numel);
    if (mode_ == Mode::kGradOp) slice.copy_(flat(param.tensor).narrow(0, o.param_offset, o.numel));
    if (!has_grad_[static_cast<size_t>(o.param)]) continue;
    adamw_update(slice, grad_shard_.narrow(0, o.shard_offset, o.numel), exp_avg_.narrow(0, o.shard_offset, o.numel),
                 exp_avg_sq_.narrow(0, o.shard_offset, o.numel), param.step, lr, param.shape.size() >= 2, options_);
  }
  grad_shard_ = at::Tensor();
}

void ShardedAdamW::discard_gradients() {
  if (params_.empty()) return;
  if (!grad_shard_.defined()) throw std::logic_error("ShardedAdamW::discard_gradients before reduce_gradients");
  grad_shard_ = at::Tensor();
  release_all();  // as after gather_parameters: the blocks hold no values between steps
}

void ShardedAdamW::gather_parameters() {
  at::NoGradGuard no_grad;
  if (params_.empty()) return;
  if (!param_shard_.defined()) throw std::logic_error("ShardedAdamW::gather_parameters before update");
  if (pinned_ > 0) throw std::logic_error("ShardedAdamW::gather_parameters inside a WholeScope");
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const ShardLayout::Bucket& bucket = layout_.buckets[b];
    if (sharded(static_cast<size_t>(bucket.first_param))) continue;  // gathered where it is used
    const at::Tensor whole = gather_bucket(param_shard_, static_cast<int64_t>(b));
    for (int64_t p = bucket.first_param; p < bucket.end_param; ++p) {
      const ShardLayout::Placement& pl = layout_.params[static_cast<size_t>(p)];
      flat(params_[static_cast<size_t>(p)].tensor).copy_(whole.narrow(0, pl.offset, pl.numel));
    }
  }
  if (mode_ == Mode::kGradOp) param_shard_ = at::Tensor();
  // A block still gathered (kept for a backward without recomputation) holds the old values.
  release_all();
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
    const int64_t numel = layout_.params[static_cast<size_t>(&p - params_.data())].numel;  // kFull may have emptied it
    for (const char* m : {".exp_avg", ".exp_avg_sq"})
      if (entry(tensors, p.name + m).numel() != numel)
        throw std::runtime_error("optimizer state: " + p.name + m + " has " +
                                 std::to_string(entry(tensors, p.name + m).numel()) + " elements, the parameter " +
                                 std::to_string(numel));
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
