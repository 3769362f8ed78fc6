// A run's layout as one short label (see layout_label.h).
#include "config/layout_label.h"

namespace deepen {

std::string layout_label(const ParallelConfig& p) {
  const ParallelConfig defaults;
  std::string out = std::to_string(p.teacher_pipelines) + "x" + std::to_string(p.teacher_stages) + "+" +
                    std::to_string(p.students);
  if (p.rank_order != defaults.rank_order) out += std::string(" ") + option_name(p.rank_order);
  if (p.sharding != defaults.sharding) out += std::string(" ") + option_name(p.sharding);
  return out;
}

}  // namespace deepen
