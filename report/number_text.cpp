// Number formatting for the report's tables, CSV files and plot data.
#include "report/number_text.h"

#include <cmath>
#include <cstdio>

namespace deepen {
namespace {
std::string printed(const char* format, int digits, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, digits, v);
  return buf;
}
}  // namespace

std::string fixed(double v, int digits) { return printed("%.*f", digits, v); }
std::string signed_fixed(double v, int digits) { return printed("%+.*f", digits, v); }
std::string general(double v) { return printed("%.*g", 4, v); }
std::string precise(double v) { return printed("%.*g", 12, v); }
std::string plot_number(double v) { return std::isfinite(v) ? printed("%.*g", 8, v) : "NaN"; }

std::string thousands(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace deepen
