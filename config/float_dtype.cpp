// The one parser of "fp32" / "bf16".
#include "config/float_dtype.h"

#include "config/input_error.h"

namespace deepen {

FloatDtype parse_float_dtype(const std::string& text, const std::string& where) {
  if (text == "fp32") return FloatDtype::kFp32;
  if (text == "bf16") return FloatDtype::kBf16;
  throw InputError(where + ": must be \"fp32\" | \"bf16\", got \"" + text + "\"");
}

const char* float_dtype_name(FloatDtype dtype) { return dtype == FloatDtype::kBf16 ? "bf16" : "fp32"; }

int float_dtype_bytes(FloatDtype dtype) { return dtype == FloatDtype::kBf16 ? 2 : 4; }

}  // namespace deepen
