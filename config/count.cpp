// parse_count: "50M" -> 50'000'000.
#include "config/count.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace deepen {

int64_t parse_count(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("empty count");
  double mult = 1;
  std::string num = text;
  switch (text.back()) {
    case 'K': case 'k': mult = 1e3; num.pop_back(); break;
    case 'M': case 'm': mult = 1e6; num.pop_back(); break;
    case 'B': case 'b': case 'G': case 'g': mult = 1e9; num.pop_back(); break;
    case 'T': case 't': mult = 1e12; num.pop_back(); break;
    default: break;
  }
  double value = 0;
  auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), value);
  if (ec != std::errc() || end != num.data() + num.size() || num.empty() || value < 0)
    throw std::invalid_argument("not a count: \"" + text + "\" (use e.g. 1234, 50M, 2.5B)");
  const double total = value * mult;
  if (total != std::floor(total)) throw std::invalid_argument("not a whole count: \"" + text + "\"");
  return static_cast<int64_t>(total);
}

}  // namespace deepen
