// Test helpers for placement and growth tests: a student's weights made like a trained one's, and the
// relative L2 distance the comparisons use.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "model/student.h"

namespace deepen::test {

// Projections of order one (std 0.02 leaves every sub-layer a small correction to the residual) and
// norm gains 1 ± 0.3, so every term of every placement shows in the logits and the gradients, and a
// growth that only works with unit gains cannot pass by luck. Layers below `from_layer` (and, when
// it is > 0, the embedding, head and boundary norms) are left as they are.
inline void scramble(GrowableStudent& s, uint64_t seed, int64_t from_layer = 0) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : s.named_parameters()) {
    const int64_t layer = block_of_parameter(item.key());
    if (layer < from_layer && (layer >= 0 || from_layer > 0)) continue;
    at::Tensor p = item.value();
    const bool gain = item.key().find("norm.weight") != std::string::npos;
    const double fan_in = p.dim() == 2 ? static_cast<double>(p.size(1)) : 1.0;
    p.copy_(gain ? 1 + 0.3 * at::randn(p.sizes(), gen) : at::randn(p.sizes(), gen) / std::sqrt(fan_in));
  }
}

// ||got − want|| / ||want|| in double (||got − want|| when want is 0).
inline double relative_l2(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble), g = got.to(at::kDouble);
  const double norm = w.norm().item<double>();
  const double diff = (g - w).norm().item<double>();
  return norm == 0 ? diff : diff / norm;
}

}  // namespace deepen::test
