// The median the benches report: of repeated timings, the middle one (upper middle for an even count).
#pragma once

#include <algorithm>
#include <vector>

namespace deepen {

// Example: {3, 1, 2} -> 2; {4, 1, 3, 2} -> 3. v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace deepen
