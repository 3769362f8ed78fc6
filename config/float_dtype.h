// FloatDtype: the floating-point types a config names ("fp32" | "bf16"), parsed in one place.
#pragma once

#include <string>

namespace deepen {

// What teacher.dtype, student.dtype, distill.channel_dtype, parallel.activation_dtype and
// `deepen forward --dtype` may say. The ground floor is torch-free: model/torch_dtype.h is the one
// place that turns a FloatDtype into an at::ScalarType.
enum class FloatDtype { kFp32, kBf16 };

// "fp32" -> kFp32, "bf16" -> kBf16. Anything else throws InputError
//   "<where>: must be \"fp32\" | \"bf16\", got \"fp16\""
// where `where` names the file and key (e.g. "x.toml: student.dtype").
FloatDtype parse_float_dtype(const std::string& text, const std::string& where);

// kFp32 -> "fp32", kBf16 -> "bf16" (what parse_float_dtype reads back).
const char* float_dtype_name(FloatDtype dtype);

// Bytes per element: 4 or 2.
int float_dtype_bytes(FloatDtype dtype);

}  // namespace deepen
