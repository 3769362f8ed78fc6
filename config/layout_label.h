// A run's layout as one short label, for study plans, reports and scaling tables.
#pragma once

#include <string>

#include "config/config.h"

namespace deepen {

// "T x P + S", then parallel.rank_order and parallel.sharding when not their defaults, so two runs
// of the same T, P, S that differ in either get different labels (a report keeps them apart
// instead of counting one as a repeat of the other). bucket_cap_mb is left out: it tunes the
// reduction, not which rank holds what.
// Examples: 2x1+4 (roles, none); 2x1+4 pipelines; 1x1+4 grad_op; 2x1+4 pipelines grad_op.
std::string layout_label(const ParallelConfig& p);

}  // namespace deepen
