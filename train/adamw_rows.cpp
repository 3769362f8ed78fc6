// AdamW's one-pass fp32 update (see adamw_rows.h). Built -O3 with SIMD clones, -ffp-contract=off
// (no FMA: the vector body and the scalar tail round alike) and -fno-math-errno (sqrt vectorizes).
#include "train/adamw_rows.h"

#include <cmath>

#include "model/vector_exp.h"

namespace deepen::adamw_rows {
namespace {

template <bool kDecay>
DEEPEN_CLONE_BODY void update_impl(float* p, const float* g, float* m, float* v, int64_t n, const Constants& c) {
  const float df = c.decay_factor, b1 = c.beta1, ob1 = c.one_minus_beta1, b2 = c.beta2, ob2 = c.one_minus_beta2;
  const float sbc2 = c.sqrt_bc2, eps = c.eps, step = c.step_size;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * b1 + ob1 * gi;
    const float vi = v[i] * b2 + ob2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = kDecay ? p[i] * df : p[i];
    p[i] = pi + step * (mi / (std::sqrt(vi) / sbc2 + eps));
  }
}

}  // namespace

DEEPEN_CLONES
void update(float* p, const float* g, float* m, float* v, int64_t n, const Constants& c) {
  if (c.decay) update_impl<true>(p, g, m, v, n, c);
  else update_impl<false>(p, g, m, v, n, c);
}

}  // namespace deepen::adamw_rows
