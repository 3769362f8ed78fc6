// Fused fp32 row kernels; built at -O3 with one clone per x86 vector width (AVX-512, AVX2, base),
// picked at load time, so the binary runs on any x86-64 and vectorizes where the CPU can.
#include "model/fused_kernels.h"

#include <algorithm>
#include <cmath>

#include "model/vector_exp.h"

namespace deepen::kernels {

DEEPEN_CLONES
void rms_norm_forward(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                      float* rstd, int64_t rows, int64_t dim, float eps) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x + i * x_stride;
    float* yr = y + i * y_stride;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    const float r = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
    rstd[i] = r;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) yr[j] = w[j] * (xr[j] * r);
  }
}

DEEPEN_CLONES
void rms_norm_backward(const float* g, int64_t g_stride, const float* x, int64_t x_stride,
                       const float* w, const float* rstd, float* dx, int64_t dx_stride, float* dw_acc,
                       int64_t rows, int64_t dim) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* gr = g + i * g_stride;
    const float* xr = x + i * x_stride;
    float* dxr = dx + i * dx_stride;
    const float r = rstd[i];
    float dot = 0.f;  // sum_j g*w*xh
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < dim; ++j) dot += gr[j] * w[j] * xr[j];
    const float c = dot * r / static_cast<float>(dim);  // mean(g*w*xh), xh = x*r
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) {
      const float xh = xr[j] * r;
      dw_acc[j] += gr[j] * xh;
      dxr[j] = r * (gr[j] * w[j] - xh * c);
    }
  }
}

DEEPEN_CLONES
void rope_forward_row(float* y, const float* cos, const float* sin, int64_t d) {
  const int64_t h = d / 2;
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float a = y[j], b = y[j + h];
    y[j] = a * cos[j] + (-b) * sin[j];
    y[j + h] = b * cos[j + h] + a * sin[j + h];
  }
}

DEEPEN_CLONES
void rope_backward_row(float* g, const float* cos, const float* sin, int64_t d) {
  const int64_t h = d / 2;
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float a = g[j], b = g[j + h];
    g[j] = a * cos[j] + b * sin[j + h];
    g[j + h] = b * cos[j + h] - a * sin[j];
  }
}

DEEPEN_CLONES
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float s = 1.f / (1.f + vexp(-gate[j]));
    out[j] = gate[j] * s * up[j];
  }
}

DEEPEN_CLONES
void swiglu_backward(const float* g, const float* gate, const float* up, float* dgate, float* dup, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float s = 1.f / (1.f + vexp(-gate[j]));
    dup[j] = g[j] * gate[j] * s;
    dgate[j] = g[j] * up[j] * (s * (1.f + gate[j] * (1.f - s)));
  }
}

}  // namespace deepen::kernels
