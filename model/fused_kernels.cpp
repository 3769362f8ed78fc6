// Fused fp32 row kernels; built at -O3 with one clone per x86 vector width (AVX-512, AVX2, base),
// picked at load time, so the binary runs on any x86-64 and vectorizes where the CPU can.
#include "model/fused_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DEEPEN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DEEPEN_CLONES
#endif

namespace deepen::kernels {
namespace {

// exp for the sigmoid in SwiGLU, written so that the loop around it vectorizes (libm's expf does
// not without -ffast-math): Cephes' expf, range-reduced by ln 2 with a degree-6 polynomial,
// about 1 ulp on [-87, 88]; inputs are clamped to that range (sigmoid saturates long before).
// Every step is a vector instruction on AVX2 and AVX-512: the clamp is min/max (GCC if-converts it
// only with -fno-trapping-math, set for this file in model/CMakeLists.txt), n = round(x / ln 2)
// adds and subtracts 1.5 * 2^23 (round-to-nearest, exact for |x / ln 2| < 2^22; |r| <= ln2 / 2
// as with Cephes' floor(x / ln 2 + 0.5)), and 2^n is built in the exponent bits by bit_cast (a
// memcpy there kept GCC 12 from vectorizing: SwiGLU ran scalar, 6-10x slower than ATen).
inline float vexp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace

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
