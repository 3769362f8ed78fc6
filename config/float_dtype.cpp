// The one parser of "fp32" / "bf16" (its spellings are an option's: config/options.h).
#include "config/float_dtype.h"

#include "config/options.h"

namespace deepen {

FloatDtype parse_float_dtype(const std::string& text, const std::string& where) {
  return parse_option<FloatDtype>(text, where);
}

const char* float_dtype_name(FloatDtype dtype) { return option_name(dtype); }

int float_dtype_bytes(FloatDtype dtype) { return dtype == FloatDtype::kBf16 ? 2 : 4; }

}  // namespace deepen
