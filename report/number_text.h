// How the report writes numbers: table cells, CSV values and gnuplot data.
#pragma once

#include <cstdint>
#include <string>

namespace deepen {

std::string fixed(double v, int digits = 4);         // 2.76031 -> "2.7603"
std::string signed_fixed(double v, int digits = 4);  // -0.0332 -> "-0.0332", 0.0004 -> "+0.0004"
std::string general(double v);                       // 4 significant digits: 2431.7 -> "2432"
std::string precise(double v);                       // 12 significant digits (CSV: tests recompute them)
std::string plot_number(double v);                   // 8 significant digits, "NaN" when not finite (gnuplot)
std::string thousands(int64_t v);                    // 1234567 -> "1,234,567"

}  // namespace deepen
