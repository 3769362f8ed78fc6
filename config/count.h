// Counts written for people: "50M", "2.5B", "1234" -> an exact integer.
#pragma once

#include <cstdint>
#include <string>

namespace deepen {

// Suffixes K (1e3), M (1e6), B or G (1e9), T (1e12), either case; the result must be whole.
//   "50M" -> 50'000'000, "2.5B" -> 2'500'000'000, "1234" -> 1234, "1.5K" -> 1500
// Throws std::invalid_argument ("not a count: ...") for anything else; the caller names the key.
int64_t parse_count(const std::string& text);

}  // namespace deepen
