// Balanced contiguous split of decoder layers into pipeline stages.
#include "model/layer_split.h"

#include <algorithm>
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

std::vector<std::pair<int, int>> split_layers_with_head(int num_layers, int stages, double head_layers) {
  if (!(head_layers >= 0))
    throw InputError("teacher head cost: must be >= 0 layers' worth, got " + std::to_string(head_layers));
  if (stages < 2) return split_layers(num_layers, stages);  // also validates stages and layers
  split_layers(num_layers, stages);                        // the same errors as the plain split
  // cost(L): the most expensive stage when the last one has L layers.
  auto cost = [&](int last) {
    const int rest = num_layers - last;
    return std::max(last + head_layers, static_cast<double>((rest + stages - 2) / (stages - 1)));
  };
  const int max_last = num_layers - (stages - 1);
  double best = cost(1);
  for (int last = 2; last <= max_last; ++last) best = std::min(best, cost(last));
  int best_last = -1, smallest = -1;
  for (int last = 1; last <= max_last; ++last) {
    if (cost(last) != best) continue;
    if (smallest < 0) smallest = last;
    if (last + head_layers <= static_cast<double>((num_layers - last) / (stages - 1))) best_last = last;
  }
  if (best_last < 0) best_last = smallest;
  std::vector<std::pair<int, int>> ranges = split_layers(num_layers - best_last, stages - 1);
  ranges.emplace_back(num_layers - best_last, num_layers);
  return ranges;
}

double lm_head_layer_equivalents(int64_t vocab, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 int64_t intermediate) {
  const double layer = static_cast<double>(hidden) * head_dim * (heads + 2 * kv_heads) +
                       static_cast<double>(heads) * head_dim * hidden + 3.0 * hidden * intermediate;
  return static_cast<double>(vocab) * hidden / layer;
}

double last_stage_head_layers(TeacherOutput distill_logits, int64_t vocab, int64_t hidden, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, int64_t intermediate) {
  if (distill_logits == TeacherOutput::kHidden) return 0.0;
  return lm_head_layer_equivalents(vocab, hidden, heads, kv_heads, head_dim, intermediate);
}

}  // namespace deepen
