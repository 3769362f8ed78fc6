// AdamW's update of fp32 values on the CPU in one pass: each element's parameter, moments and
// gradient read once and written once. Torch-free (train/adamw.cpp splits the work over threads).
#pragma once

#include <cstdint>

namespace deepen::adamw_rows {

// The update's per-step constants, in fp32 as ATen's ops would round them from the double options.
struct Constants {
  bool decay = false;
  float decay_factor = 1;   // 1 − lr·weight_decay
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_bc2 = 1;       // √(1 − β2^step)
  float eps = 0;
  float step_size = 0;      // −lr / (1 − β1^step)
};

// For i in [0, n), in the order train/adamw.cpp's op sequence applies them (each result rounded to
// fp32, no fused multiply-adds, so an element's result does not depend on where a slice of the
// tensor starts: replicated and sharded optimizers agree bit for bit):
//   p ← p·decay_factor (when decay);  m ← m·β1 + (1 − β1)·g;  v ← v·β2 + (1 − β2)·g·g;
//   p ← p + step_size·(m / (√v / sqrt_bc2 + eps)).
void update(float* p, const float* g, float* m, float* v, int64_t n, const Constants& c);

}  // namespace deepen::adamw_rows
