// For the hand-fused fp32 CPU kernels: DEEPEN_CLONES (one clone per x86 vector width) and vexp, an
// e^x that vectorizes inside their plain loops.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

// AVX-512, AVX2 and base x86-64 clones of a kernel, picked at load time: the binary runs on any
// x86-64 and vectorizes where the CPU can.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DEEPEN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DEEPEN_CLONES
#endif

// For a loop body a DEEPEN_CLONES function calls (a template instantiated per flag, a helper): it
// must be inlined into each clone to be compiled at that clone's vector width. Left to its cost
// model, GCC kept the loss's main pass (train/distill_rows.cpp, full_sums_impl, called twice per
// clone) out of line, built for base x86-64 (SSE2): 4-5x slower than its AVX-512 clone. The
// `layout.kernel_clones` test fails if an *_impl body is left out of line.
#define DEEPEN_CLONE_BODY [[gnu::always_inline]] inline

namespace deepen::kernels {

// libm's expf does not vectorize without -ffast-math, so the fused kernels use Cephes' expf,
// range-reduced by ln 2 with a degree-6 polynomial, about 1 ulp on [-87, 88]; inputs are clamped to
// that range. Every step is a vector instruction on AVX2 and AVX-512: the clamp is min/max (GCC
// if-converts it only with -fno-trapping-math, which every file using this must be built with, see
// model/CMakeLists.txt and train/CMakeLists.txt), n = round(x / ln 2) adds and subtracts
// 1.5 * 2^23 (round-to-nearest, exact for |x / ln 2| < 2^22; |r| <= ln2 / 2 as with Cephes'
// floor(x / ln 2 + 0.5)), and 2^n is built in the exponent bits by bit_cast (a memcpy there kept
// GCC 12 from vectorizing: SwiGLU ran scalar, 6-10x slower than ATen).
DEEPEN_CLONE_BODY float vexp(float x) {
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

// e^x for the shifted logits of a softmax (x <= 0): 0 below -87, where e^x < 1.7e-38 is below
// anything a sum of terms that include e^0 = 1 can hold, and for -inf (a masked column), which
// vexp's clamp would otherwise turn into e^-87.
DEEPEN_CLONE_BODY float vexp_softmax(float x) {
  const float e = vexp(x);
  return x < -87.0f ? 0.0f : e;
}

}  // namespace deepen::kernels
