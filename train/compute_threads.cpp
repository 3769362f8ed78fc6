// Sets LibTorch's intra-op threads from the config or the process's CPU affinity.
#include "train/compute_threads.h"

#include <sched.h>

#include <ATen/Parallel.h>

namespace deepen {

int64_t set_compute_threads(int64_t n) {
  if (n <= 0) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  at::set_num_threads(static_cast<int>(n));
  return at::get_num_threads();
}

}  // namespace deepen
