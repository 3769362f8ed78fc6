// Hand-fused fp32 CPU kernels for the student's hot elementwise paths (RMSNorm, QK-norm + RoPE,
// SwiGLU), forward and backward, on raw rows: one pass over memory where ATen's op-by-op path
// (what transformers runs) makes five to ten. Torch-free; the autograd wrappers live in qwen3.cpp.
// Same arithmetic as the HF op sequence (fp32 throughout), up to summation order.
#pragma once

#include <cstdint>

namespace deepen::kernels {

// Rows [0, rows) of x (row stride x_stride) -> y = w * (x * r), r = 1/sqrt(mean(x^2) + eps),
// y rows of stride y_stride; rstd[i] = r of row i.
void rms_norm_forward(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                      float* rstd, int64_t rows, int64_t dim, float eps);

// Given g = dL/dy: dx = r * (g*w - xh * mean(g*w*xh)), xh = x * r; dw_acc += sum over rows of g*xh.
void rms_norm_backward(const float* g, int64_t g_stride, const float* x, int64_t x_stride,
                       const float* w, const float* rstd, float* dx, int64_t dx_stride, float* dw_acc,
                       int64_t rows, int64_t dim);

// One head row of d values (d even), in place: y = y*cos + rotate_half(y)*sin, rotate_half(y) =
// cat(-y[d/2:], y[:d/2]) (HF's half-split convention).
void rope_forward_row(float* y, const float* cos, const float* sin, int64_t d);
// Its transpose, in place on the gradient: g <- g*cos + R^T(g*sin), R^T(z) = cat(z[d/2:], -z[:d/2]).
void rope_backward_row(float* g, const float* cos, const float* sin, int64_t d);

// out = silu(gate) * up over n values.
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);
// g = dL/dout -> dgate = g * up * silu'(gate), dup = g * silu(gate).
void swiglu_backward(const float* g, const float* gate, const float* up, float* dgate, float* dup, int64_t n);

}  // namespace deepen::kernels
