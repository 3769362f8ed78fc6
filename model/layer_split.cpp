// Balanced contiguous split of decoder layers into pipeline stages.
#include "model/layer_split.h"

#include <string>

#include "config/input_error.h"

namespace deepen {

std::vector<std::pair<int, int>> split_layers(int num_layers, int stages) {
  if (stages < 1 || stages > num_layers)
    throw InputError("parallel.teacher_stages: " + std::to_string(stages) + " stages for a teacher of " +
                     std::to_string(num_layers) + " layers; need 1 <= stages <= layers");
  std::vector<std::pair<int, int>> ranges;
  const int base = num_layers / stages;
  const int extra = num_layers % stages;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int n = base + (s < extra ? 1 : 0);
    ranges.emplace_back(first, first + n);
    first += n;
  }
  return ranges;
}

}  // namespace deepen
