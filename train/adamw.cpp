// AdamW update with per-parameter state addressed by name.
#include "train/adamw.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "train/adamw_rows.h"

namespace deepen {

void AdamW::add(const std::string& name, const at::Tensor& param) {
  auto it = params_.find(name);
  if (it != params_.end()) {
    it->second.param = param;
    return;
  }
  Slot slot;
  slot.param = param;
  slot.exp_avg = at::zeros_like(param, at::MemoryFormat::Contiguous);
  slot.exp_avg_sq = at::zeros_like(param, at::MemoryFormat::Contiguous);
  params_.emplace(name, std::move(slot));
}

void AdamW::keep_only(const std::vector<std::string>& names) {
  const std::set<std::string> keep(names.begin(), names.end());
  for (auto it = params_.begin(); it != params_.end();) it = keep.count(it->first) ? std::next(it) : params_.erase(it);
}

std::vector<std::string> AdamW::names() const {
  std::vector<std::string> out;
  for (const auto& [name, s] : params_) out.push_back(name);
  return out;
}

namespace {

// Σ x² of n fp32 values in fp64, in place: four running sums (the additions' latency, not the
// memory, would bound one), added at the end.
double block_sum_of_squares(const float* x, int64_t n) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// The same over blocks of 2^16 values summed on every compute thread, the blocks' sums then added
// in order: deterministic (the order depends on n only, not on the thread count), and a [V, H]
// gradient's pass no longer runs on one core.
double cpu_sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  std::vector<double> blocks(static_cast<size_t>((n + kBlock - 1) / kBlock), 0.0);
  at::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      blocks[static_cast<size_t>(b)] = block_sum_of_squares(x + b * kBlock, std::min(kBlock, n - b * kBlock));
  });
  double s = 0;
  for (double v : blocks) s += v;
  return s;
}

}  // namespace

double sum_of_squares(const std::vector<at::Tensor>& pieces) {
  // Every square is exact in fp64. fp32 pieces on the CPU are summed in place; anything else is
  // widened to fp64 a slice of 2^20 elements at a time (8 MiB, which the allocator reuses from slice
  // to slice). Widening a whole [V, H] gradient, and squaring it, made fresh memory of 4x the
  // gradients every step, 1.2 GB for the two 151,936 x 256 matrices of a small Qwen3-vocabulary
  // student, first-touched at ~11 us per 4 KiB page on some VMs (kd_step_bench: clip + AdamW 5.0 s
  // against PyTorch's 2.1 s). Only the order in which the squares are added changes.
  constexpr int64_t kSlice = int64_t{1} << 20;
  std::vector<double> host(pieces.size(), 0.0);
  std::vector<at::Tensor> sums;  // the other pieces' sums, on their device
  std::vector<size_t> of;        // which piece each of those is
  for (size_t i = 0; i < pieces.size(); ++i) {
    const at::Tensor& t = pieces[i];
    if (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()) {
      host[i] = cpu_sum_of_squares(t.data_ptr<float>(), t.numel());
      continue;
    }
    const at::Tensor flat = t.reshape({-1});
    std::vector<at::Tensor> parts;
    for (int64_t begin = 0; begin < flat.numel(); begin += kSlice) {
      const at::Tensor d = flat.narrow(0, begin, std::min(kSlice, flat.numel() - begin)).to(at::kDouble);
      parts.push_back(at::dot(d, d));
    }
    if (parts.empty()) continue;
    sums.push_back(at::stack(parts).sum());
    of.push_back(i);
  }
  if (!sums.empty()) {
    const at::Tensor values = at::stack(sums).to(at::kCPU);
    const double* p = values.data_ptr<double>();
    for (size_t j = 0; j < of.size(); ++j) host[of[j]] = p[j];
  }
  double sq = 0;
  for (double v : host) sq += v;  // in the pieces' order
  return sq;
}

void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, int64_t step, double lr, bool decay, const AdamWOptions& o) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  const bool fused = param.device().is_cpu() && param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat &&
                     exp_avg.scalar_type() == at::kFloat && exp_avg_sq.scalar_type() == at::kFloat &&
                     grad.device().is_cpu() && param.is_contiguous() && grad.is_contiguous() &&
                     exp_avg.is_contiguous() && exp_avg_sq.is_contiguous();
  if (fused) {
    // One pass over the four tensors where the op sequence below makes eight, and two [V, H]
    // temporaries (sqrt, the division) at a large vocabulary: clip + AdamW of a 151,936-vocabulary
    // student took 0.50 s a step on 2 cores that way, 0.05-0.07 s this way (docs/performance.md).
    adamw_rows::Constants c;
    c.decay = o.weight_decay > 0 && decay;
    c.decay_factor = static_cast<float>(1.0 - lr * o.weight_decay);
    c.beta1 = static_cast<float>(o.beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
    c.beta2 = static_cast<float>(o.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    c.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
    c.eps = static_cast<float>(o.eps);
    c.step_size = static_cast<float>(-lr / bc1);
    float* p = param.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    float* m = exp_avg.data_ptr<float>();
    float* v = exp_avg_sq.data_ptr<float>();
    at::parallel_for(0, param.numel(), int64_t{1} << 15, [&](int64_t begin, int64_t end) {
      adamw_rows::update(p + begin, g + begin, m + begin, v + begin, end - begin, c);
    });
    return;
  }
  if (o.weight_decay > 0 && decay) param.mul_(1.0 - lr * o.weight_decay);
  exp_avg.mul_(o.beta1).add_(grad, 1.0 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1.0 - o.beta2);
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(o.eps);
  param.addcdiv_(exp_avg, denom, -lr / bc1);
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  for (auto& [name, s] : params_) {
    const at::Tensor& grad = s.param.grad();
    if (!grad.defined() || !s.param.requires_grad()) continue;
    s.step += 1;
    adamw_update(s.param, grad, s.exp_avg, s.exp_avg_sq, s.step, lr, s.param.dim() >= 2, options_);
  }
}

void AdamW::zero_grad() {
  for (auto& [name, s] : params_) {
    // Dropping the gradient (not zeroing it) keeps frozen parameters gradient-free, so step()
    // can tell them apart by grad().defined().
    s.param.mutable_grad() = at::Tensor();
  }
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, s] : params_) {
    out.emplace_back(name + ".exp_avg", s.exp_avg);
    out.emplace_back(name + ".exp_avg_sq", s.exp_avg_sq);
    out.emplace_back(name + ".step", at::full({1}, s.step, at::kLong));
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  auto get = [&](const std::string& key) -> const at::Tensor& {
    auto it = tensors.find(key);
    if (it == tensors.end()) throw std::runtime_error("optimizer state: missing " + key);
    return it->second;
  };
  for (auto& [name, s] : params_) {
    s.exp_avg.copy_(get(name + ".exp_avg"));
    s.exp_avg_sq.copy_(get(name + ".exp_avg_sq"));
    s.step = get(name + ".step").item<int64_t>();
  }
}

}  // namespace deepen
