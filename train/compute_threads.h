// Intra-op thread count for LibTorch, set explicitly because LibTorch may start with one thread.
#pragma once

#include <cstdint>

namespace deepen {

// n = 0 uses every core this process may run on (sched affinity, so mpirun/srun binding counts).
// Returns the count in force afterwards.
int64_t set_compute_threads(int64_t n);

}  // namespace deepen
