// The one place a config's FloatDtype becomes a LibTorch scalar type, and back.
#pragma once

#include <c10/core/ScalarType.h>

#include "config/float_dtype.h"

namespace deepen {

// kFp32 <-> at::kFloat, kBf16 <-> at::kBFloat16.
inline at::ScalarType to_scalar_type(FloatDtype dtype) {
  return dtype == FloatDtype::kBf16 ? at::kBFloat16 : at::kFloat;
}

// at::kBFloat16 -> kBf16; every other type -> kFp32 (the student and teacher compute in one of the two).
inline FloatDtype float_dtype_of(at::ScalarType type) {
  return type == at::kBFloat16 ? FloatDtype::kBf16 : FloatDtype::kFp32;
}

}  // namespace deepen
